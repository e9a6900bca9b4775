// Ethan console: the playground and the edit/delete buttons of the memory pages.
// Everything stored is shown with textContent (never innerHTML), so memory text is inert.
"use strict";

(function () {
  // ---------------------------------------------------------------- helpers
  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    if (attrs) {
      Object.keys(attrs).forEach(function (k) {
        var v = attrs[k];
        if (v === null || v === undefined || v === false) return;
        if (k === "text") node.textContent = String(v);
        else if (k === "className") node.className = v;
        else node.setAttribute(k, v === true ? "" : String(v));
      });
    }
    (children || []).forEach(function (c) {
      if (c === null || c === undefined || c === false) return;
      node.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    });
    return node;
  }

  function api(method, url, body) {
    var opts = { method: method, headers: { "Accept": "application/json" }, credentials: "same-origin" };
    if (body !== undefined) {
      opts.headers["Content-Type"] = "application/json";
      opts.body = JSON.stringify(body);
    }
    return fetch(url, opts).then(function (resp) {
      return resp.text().then(function (text) {
        var data = {};
        try { data = text ? JSON.parse(text) : {}; } catch (e) { data = { error: text || resp.statusText }; }
        if (resp.status === 401) { window.location.href = "/login?next=" + encodeURIComponent(location.pathname + location.search); }
        return { ok: resp.ok, status: resp.status, data: data };
      });
    }, function (err) {
      return { ok: false, status: 0, data: { error: "network error: " + err.message } };
    });
  }

  function showError(box, data) {
    if (!box) return;
    box.textContent = "";
    box.appendChild(el("strong", { text: data.error || "Something went wrong." }));
    if (data.reason) box.appendChild(el("div", { className: "reason", text: data.reason }));
    box.hidden = false;
  }

  function status(node, text) { if (node) node.textContent = text || ""; }

  function pageUser() {
    var n = document.querySelector("[data-user]");
    return n ? n.getAttribute("data-user") : "";
  }

  function userPath(user) { return "/api/users/" + encodeURIComponent(user); }

  // user picker: open the chosen user's page
  document.querySelectorAll("select[data-autosubmit]").forEach(function (s) {
    s.addEventListener("change", function () { s.form.submit(); });
  });

  // ---------------------------------------------------------------- playground
  var PG_KEY = "ethan.playground";

  function initPlayground() {
    var settings = document.getElementById("pg-settings");
    var form = document.getElementById("pg-form");
    var log = document.getElementById("pg-log");
    if (!settings || !form) return;
    var input = form.elements.text;
    var saved = {};
    try { saved = JSON.parse(localStorage.getItem(PG_KEY) || "{}"); } catch (e) { saved = {}; }
    if (saved.user_id) settings.elements.user_id.value = saved.user_id;
    if (typeof saved.name === "string") settings.elements.name.value = saved.name;
    if (saved.chat) settings.querySelector('input[name=chat][value="' + (saved.chat === "group" ? "group" : "p2p") + '"]').checked = true;
    if (typeof saved.mention === "boolean") settings.elements.mention.checked = saved.mention;

    function current() {
      return {
        user_id: settings.elements.user_id.value.trim(),
        name: settings.elements.name.value.trim(),
        chat: settings.querySelector("input[name=chat]:checked").value,
        mention: settings.elements.mention.checked
      };
    }
    function syncMention() {
      var group = current().chat === "group";
      settings.elements.mention.disabled = !group;
      settings.querySelector(".mention").classList.toggle("disabled", !group);
    }
    settings.addEventListener("change", function () {
      syncMention();
      try { localStorage.setItem(PG_KEY, JSON.stringify(current())); } catch (e) { /* private mode */ }
    });
    syncMention();

    log.querySelectorAll("button.example").forEach(function (b) {
      b.addEventListener("click", function () {
        input.value = b.getAttribute("data-example");
        input.focus();
      });
    });

    input.addEventListener("keydown", function (ev) {
      if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
        ev.preventDefault();
        form.requestSubmit();
      }
    });

    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var who = current();
      var text = input.value;
      if (!text.trim()) return;
      if (!settings.reportValidity()) return;
      var empty = log.querySelector(".empty-log");
      if (empty) empty.remove();
      var ex = exchange(who, text);
      log.appendChild(ex.node);
      ex.node.scrollIntoView({ block: "end" });
      input.value = "";
      var button = form.querySelector("button");
      button.disabled = true;
      var body = { user_id: who.user_id, name: who.name, chat: who.chat, mention: who.mention, text: text };
      api("POST", "/api/playground", body).then(function (r) {
        button.disabled = false;
        ex.done(r);
        ex.node.scrollIntoView({ block: "end" });
        input.focus();
      });
    });
  }

  function exchange(who, text) {
    var label = (who.name || who.user_id) + " · " + (who.chat === "p2p" ? "direct" : (who.mention ? "group, @Ethan" : "group"));
    var botText = el("div", { className: "text pending", text: "…" });
    var botMeta = el("div", { className: "meta" });
    var bot = el("div", { className: "msg bot" }, [el("div", { className: "who", text: "Ethan" }), botText, botMeta]);
    // open beside the answer on wide screens; folded under it on phones
    var panel = el("details", { className: "panel", "aria-label": "Memory given to the model",
      open: window.matchMedia("(min-width: 861px)").matches },
      [el("summary", { className: "panel-head" }, [el("span", { className: "panel-title", text: "What the model was given" })]),
       el("p", { className: "muted", text: "Waiting for the answer…" })]);
    var node = el("article", { className: "exchange" }, [
      el("div", { className: "turns" }, [
        el("div", { className: "msg user" }, [el("div", { className: "who", text: label }), el("div", { className: "text", text: text })]),
        bot
      ]),
      panel
    ]);
    return {
      node: node,
      done: function (r) {
        var d = r.data || {};
        botText.classList.remove("pending");
        if (!r.ok && d.status !== "timeout") {
          botText.textContent = d.error || (d.status ? "(not delivered: " + d.status + ")" : "Error " + r.status);
          bot.classList.add("failed");
          panel.textContent = "";
          panel.appendChild(el("summary", { className: "panel-head" }, [el("span", { className: "panel-title", text: "No answer" })]));
          panel.appendChild(el("p", { className: "muted", text: d.reason ? d.reason : (d.status ? "status: " + d.status : "No answer.") }));
          return;
        }
        if (d.status === "ignored") {
          bot.classList.add("ignored");
          botText.textContent = "(no answer — ignored: " + (d.reason || "not for the bot") + ")";
        } else if (d.status === "timeout") {
          bot.classList.add("failed");
          botText.textContent = "(no answer within the deadline)";
        } else {
          botText.textContent = d.text || "";
        }
        var meta = [];
        if (d.elapsed_ms !== undefined) meta.push(d.elapsed_ms + " ms");
        if (d.session_id) meta.push("session …" + d.session_id.slice(-4));
        botMeta.textContent = meta.join(" · ");
        if (d.session_id) {
          botMeta.appendChild(document.createTextNode(" · "));
          botMeta.appendChild(el("a", { href: "/sessions/" + encodeURIComponent(d.session_id) + "?user=" + encodeURIComponent(d.user_id), text: "open" }));
        }
        renderPanel(panel, d);
      }
    };
  }

  function section(title, hint, count, body, open) {
    var summary = el("summary", null, [el("span", { className: "sec-title", text: title }),
      el("span", { className: "count" + (count ? "" : " zero"), text: String(count) })]);
    if (hint) summary.appendChild(el("span", { className: "hint", text: hint }));
    var d = el("details", { className: "mem-section" + (count ? "" : " empty"), open: open && count > 0 }, [summary]);
    d.appendChild(body || el("p", { className: "muted", text: "nothing" }));
    return d;
  }

  function renderPanel(panel, d) {
    panel.textContent = "";
    var m = d.memory;
    var head = el("summary", { className: "panel-head" }, [el("span", { className: "panel-title", text: "What the model was given" })]);
    panel.appendChild(head);
    if (!m) {
      panel.open = true;
      panel.appendChild(el("p", { className: "muted", text: d.status === "ignored"
        ? "The message did not reach the agent, so no memory was read."
        : "A slash command answered: no memory was given to a model." }));
      return;
    }
    if (m.error) { panel.appendChild(el("p", { className: "error", text: m.error })); return; }
    var facts = m.facts || [], rules = m.rules || [], eps = m.episodes || [];
    var gist = [facts.length + (facts.length === 1 ? " fact" : " facts")];
    if (m.profile) gist.push("profile");
    if (rules.length) gist.push(rules.length + (rules.length === 1 ? " rule" : " rules"));
    if (eps.length) gist.push(eps.length + (eps.length === 1 ? " episode" : " episodes"));
    if (m.summary) gist.push("summary");
    if (m.long_term) gist.push("long-term");
    head.appendChild(el("span", { className: "panel-gist", text: m.path + " · " + gist.join(" · ") }));
    panel.appendChild(el("div", { className: "badges" }, [
      el("span", { className: "badge path-" + m.path, title: "path: fast (small talk: top-5 facts, no profile), medium, full (also recalls episodes)", text: "path " + m.path }),
      el("span", { className: "badge", title: "mode", text: "mode " + m.mode }),
      el("span", { className: "badge", title: "hot turns replayed verbatim", text: m.hot_turns + " hot turns" })
    ]));
    if (m.tokens) {
      // what the provider's prompt cache served for this answer (all its model calls)
      var t = m.tokens, input = t.cached + t.written + t.uncached;
      panel.appendChild(el("div", { className: "tokens", title: "input tokens of this answer: read from the prompt cache (0.1× price) · written to it (1.25×) · not cached (1×)" }, [
        el("span", { className: "tok cached", text: t.cached + " cached" }),
        el("span", { className: "tok written", text: t.written + " written" }),
        el("span", { className: "tok uncached", text: t.uncached + " uncached" }),
        el("span", { className: "tok share", text: input ? Math.round(100 * t.cached / input) + "% of " + input + " input tokens from cache" : "no input tokens reported" })
      ]));
    }
    var list = el("ul", { className: "facts" }, facts.map(function (f) {
      return el("li", { "data-fact-id": f.id }, [
        el("span", { className: "content", text: f.content }),
        el("span", { className: "fact-meta", text: f.category + " · " + Number(f.confidence).toFixed(2) + " · " + f.source + " · #" + f.id })
      ]);
    }));
    panel.appendChild(section("Facts", "<memory_context>", facts.length, facts.length ? list : null, true));
    panel.appendChild(section("Profile", "<user_profile>", m.profile ? 1 : 0,
      m.profile ? el("pre", { className: "mem", text: m.profile }) : null, true));
    panel.appendChild(section("Rules", "<behavioral_guidelines>", rules.length,
      rules.length ? el("ul", null, rules.map(function (r) { return el("li", { text: r }); })) : null, true));
    panel.appendChild(section("Episodes", "<related_episodes>", eps.length,
      eps.length ? el("ul", null, eps.map(function (e) {
        return el("li", null, [el("span", { text: e.summary }),
          el("span", { className: "fact-meta", text: (e.keywords || []).join(", ") })]);
      })) : null, true));
    panel.appendChild(section("Summary", "[对话摘要]", m.summary ? 1 : 0,
      m.summary ? el("pre", { className: "mem", text: m.summary }) : null, true));
    panel.appendChild(section("Long-term", "[长期记忆]", m.long_term ? 1 : 0,
      m.long_term ? el("pre", { className: "mem", text: m.long_term }) : null, true));
    if (d.tools && d.tools.length) {
      panel.appendChild(section("Tools called", "written to memory", d.tools.length,
        el("ul", null, d.tools.map(function (t) {
          return el("li", { className: t.is_error ? "tool-error" : "" }, [el("span", { text: t.name }),
            el("span", { className: "fact-meta", text: t.result })]);
        })), true));
    }
  }

  // ---------------------------------------------------------------- profile
  function initProfile() {
    var form = document.getElementById("profile-form");
    if (!form) return;
    var box = form.querySelector(".error");
    var st = form.querySelector(".status");
    var area = form.elements.document;
    var original = area.value;
    form.querySelector("[data-action=reload]").addEventListener("click", function () { window.location.reload(); });
    area.addEventListener("input", function () { status(st, area.value === original ? "" : "unsaved changes"); });
    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      box.hidden = true;
      status(st, "Saving…");
      var user = form.getAttribute("data-user");
      api("PUT", userPath(user) + "/profile", { document: area.value, version: form.getAttribute("data-version") })
        .then(function (r) {
          if (!r.ok) { status(st, ""); showError(box, r.data); return; }
          area.value = r.data.document;
          original = area.value;
          form.setAttribute("data-version", r.data.version);
          status(st, "Saved — " + r.data.kept + " kept, " + r.data.added + " added, " + r.data.removed + " removed.");
        });
    });
  }

  // ---------------------------------------------------------------- facts
  function initFacts() {
    var add = document.getElementById("fact-add");
    var box = document.querySelector(".card .error");
    var user = pageUser();
    if (add) add.addEventListener("submit", function (ev) {
      ev.preventDefault();
      status(add.querySelector(".status"), "Saving…");
      api("POST", userPath(user) + "/facts", { content: add.elements.content.value, category: add.elements.category.value })
        .then(function (r) { if (r.ok) window.location.reload(); else { status(add.querySelector(".status"), ""); showError(box, r.data); } });
    });
    document.querySelectorAll("table.facts tbody tr").forEach(function (row) {
      var id = row.getAttribute("data-id");
      var del = row.querySelector("[data-action=delete-fact]");
      if (del) del.addEventListener("click", function () {
        if (!window.confirm("Delete this fact? It will no longer be given to the model.")) return;
        api("DELETE", userPath(user) + "/facts/" + encodeURIComponent(id)).then(function (r) {
          if (r.ok) row.remove(); else showError(box, r.data);
        });
      });
      var edit = row.querySelector("[data-action=edit-fact]");
      if (edit) edit.addEventListener("click", function () { editFact(row, user, box); });
    });
  }

  function editFact(row, user, box) {
    if (row.classList.contains("editing")) return;
    row.classList.add("editing");
    var contentCell = row.querySelector(".fact-content");
    var old = contentCell.textContent;
    var cats = ["knowledge", "preference", "decision", "correction"];
    var text = el("textarea", { rows: 2, maxlength: 500, "aria-label": "Fact" });
    text.value = old;
    var cat = el("select", { "aria-label": "Category" }, cats.map(function (c) {
      return el("option", { value: c, selected: c === row.getAttribute("data-category"), text: c });
    }));
    var conf = el("input", { type: "number", min: 0, max: 1, step: 0.05, "aria-label": "Confidence" });
    conf.value = Number(row.getAttribute("data-confidence")).toFixed(2);
    var save = el("button", { type: "button", className: "primary", text: "Save" });
    var cancel = el("button", { type: "button", text: "Cancel" });
    var editor = el("div", { className: "fact-editor" }, [text, el("div", { className: "row" }, [cat, conf, save, cancel])]);
    contentCell.hidden = true;
    contentCell.parentNode.appendChild(editor);
    text.focus();
    cancel.addEventListener("click", function () { editor.remove(); contentCell.hidden = false; row.classList.remove("editing"); });
    save.addEventListener("click", function () {
      var body = {};
      if (text.value !== old) body.content = text.value;
      if (cat.value !== row.getAttribute("data-category")) body.category = cat.value;
      if (Number(conf.value).toFixed(2) !== Number(row.getAttribute("data-confidence")).toFixed(2)) body.confidence = Number(conf.value);
      if (!Object.keys(body).length) { cancel.click(); return; }
      api("PATCH", userPath(user) + "/facts/" + encodeURIComponent(row.getAttribute("data-id")), body).then(function (r) {
        if (r.ok) window.location.reload(); else showError(box, r.data);
      });
    });
  }

  // ---------------------------------------------------------------- rules
  function initRules() {
    var add = document.getElementById("rule-add");
    var box = document.querySelector(".card .error");
    var user = pageUser();
    if (add) add.addEventListener("submit", function (ev) {
      ev.preventDefault();
      api("POST", userPath(user) + "/procedures", { rule: add.elements.rule.value, context: add.elements.context.value })
        .then(function (r) { if (r.ok) window.location.reload(); else showError(box, r.data); });
    });
    document.querySelectorAll("[data-action=delete-rule]").forEach(function (b) {
      b.addEventListener("click", function () {
        var row = b.closest("tr");
        if (!window.confirm("Delete this rule?")) return;
        api("DELETE", userPath(user) + "/procedures/" + encodeURIComponent(row.getAttribute("data-id"))).then(function (r) {
          if (r.ok) row.remove(); else showError(box, r.data);
        });
      });
    });
  }

  // ---------------------------------------------------------------- episodes & sessions
  function initEpisodes() {
    var box = document.querySelector(".card .error");
    var user = (location.pathname.match(/^\/users\/([^/]+)\//) || [])[1];
    document.querySelectorAll("[data-action=delete-episode]").forEach(function (b) {
      b.addEventListener("click", function () {
        var item = b.closest("li");
        if (!window.confirm("Delete this episode?")) return;
        api("DELETE", "/api/users/" + user + "/episodes/" + encodeURIComponent(item.getAttribute("data-id"))).then(function (r) {
          if (r.ok) item.remove(); else showError(box, r.data);
        });
      });
    });
  }

  function initReminders() {
    var box = document.querySelector(".card .error");
    var user = (location.pathname.match(/^\/users\/([^/]+)\//) || [])[1];
    document.querySelectorAll("[data-action=cancel-reminder]").forEach(function (b) {
      b.addEventListener("click", function () {
        var row = b.closest("tr");
        if (!window.confirm("Cancel this reminder?")) return;
        api("DELETE", "/api/users/" + user + "/reminders/" + encodeURIComponent(row.getAttribute("data-id"))).then(function (r) {
          if (r.ok) { b.remove(); row.querySelector("[data-label=State]") && (row.querySelector("[data-label=State]").textContent = "cancelled"); }
          else showError(box, r.data);
        });
      });
    });
  }

  function initSession() {
    var b = document.querySelector("[data-action=delete-session]");
    if (!b) return;
    b.addEventListener("click", function () {
      if (!window.confirm("Delete this session, its messages, its episodes and summaries, and the facts and " +
                          "profile entries learned only from it?")) return;
      api("DELETE", "/api/sessions/" + encodeURIComponent(b.getAttribute("data-session"))).then(function (r) {
        if (r.ok) {
          var c = r.data.removed || {};
          window.alert("Deleted " + (c.messages || 0) + " messages, " + (c.episodes || 0) + " episodes, " +
                       (c.summaries || 0) + " summaries, " + (c.facts || 0) + " facts and " +
                       (c.profile_entries || 0) + " profile entries learned only there.");
          window.location.href = b.getAttribute("data-back") || "/sessions";
        }
        else status(b.parentNode.querySelector(".status"), r.data.error || "failed");
      });
    });
  }

  var inits = { playground: initPlayground, profile: initProfile, facts: initFacts, procedures: initRules,
    episodes: initEpisodes, reminders: initReminders, session: initSession };
  var fn = inits[document.body.getAttribute("data-page")];
  if (fn) fn();
})();
