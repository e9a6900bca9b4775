"""Take docs/console.png from the real page: ``python -m tests.web.screenshot [out.png]``.

Starts the app (offline model, fresh temporary ETHAN_HOME), has a short conversation in the
playground through the system Chromium, and captures the page with the last answer and its
memory panel. Not a test; run it when the console's look changes.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from tests.web.conftest import CHROMIUM, CHROMIUM_ARGS, ServedApp, offline_settings

CONVERSATION = [
    "我叫林一，是一名后端工程师",
    "记住我喜欢喝手冲咖啡",
    "以后回答都先给结论，再给理由",
    "下午喝点什么？顺便想想订单服务迁移到 Go 的风险",
]


def main(out: str = "docs/console.png") -> None:
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as home:
        served = ServedApp(offline_settings(Path(home))).start()
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1280, "height": 900}, device_scale_factor=1)
                page.goto(served.url + "/")
                page.fill("#pg-settings input[name=user_id]", "ou_linyi")
                page.fill("#pg-settings input[name=name]", "林一")
                for i, text in enumerate(CONVERSATION):
                    page.fill("#pg-form textarea", text)
                    page.press("#pg-form textarea", "Enter")
                    page.locator(".exchange").nth(i).locator(".msg.bot .text:not(.pending)").wait_for()
                # fold the earlier panels so the last answer's panel is the one in view
                exchanges = page.locator(".exchange")
                for i in range(exchanges.count() - 1):
                    exchanges.nth(i).locator("summary.panel-head").click()
                # a viewport as tall as the page, so the sticky composer sits at the end
                height = page.evaluate("() => document.documentElement.scrollHeight")
                page.set_viewport_size({"width": 1280, "height": height})
                page.evaluate("() => window.scrollTo(0, 0)")
                page.screenshot(path=out)
                browser.close()
        finally:
            served.stop()
    print(out)


if __name__ == "__main__":
    main(*sys.argv[1:])
