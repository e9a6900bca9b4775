"""A labelled set for episode search and recall (layer 4).

63 episodes of four users — a Chinese backend engineer (林), an English-speaking product
manager (Emma), a Chinese student starting work (赵), and a data scientist writing both
languages (Raj) — written the way the consolidation model summarises a session. Topics
overlap on purpose (two MySQL sessions, three churn-model sessions, two users talking
about churn, several about interviews, offers, trips and stress) so ranking has work to do.

``QUERIES``: what the user later types (a question in chat or a console search), with
the ids of the episodes that answer it — only ever that user's episodes.
``UNRELATED``: messages about nothing the user has talked about before; recall must
return nothing for them.

``load(store)`` writes everything through ``EpisodeStore.write`` (keywords extracted as in
production) and returns {label: episode id}.
"""

from __future__ import annotations

LIN, EMMA, ZHAO, RAJ = "ou_lin", "ou_emma", "ou_zhao", "ou_raj"

# label -> (user, chat_type, summary)
EPISODES: dict[str, tuple[str, str, str]] = {
    # 林: backend engineer at an e-commerce company
    "l01": (LIN, "p2p", "用户排查订单服务在大促期间的 MySQL 慢查询，发现 orders 表缺少 (user_id, created_at) 联合索引，助手建议加索引并用 EXPLAIN 验证执行计划，改完后 P99 延迟从 800ms 降到 120ms。"),
    "l02": (LIN, "group", "用户准备把 Redis 缓存从单机迁移到 Redis Cluster，讨论了 key 的 hash tag、多 key 命令在集群下的限制，以及迁移期间双写和灰度切流的方案。"),
    "l03": (LIN, "p2p", "用户在写季度 OKR，目标是把支付链路可用性提升到 99.99%，助手帮忙把目标拆成降级开关、对账自动化、故障演练三个关键结果。"),
    "l04": (LIN, "p2p", "用户的 Go 服务出现 goroutine 泄漏，pprof 显示大量 goroutine 阻塞在 channel 发送上，原因是 context 取消后没有退出 select，助手给出了修复写法。"),
    "l05": (LIN, "p2p", "用户想学习 Rust，问从哪本书开始，助手推荐了《Rust 程序设计语言》和 Rustlings 练习，并建议先用 Rust 重写一个小的命令行工具。"),
    "l06": (LIN, "group", "用户和团队讨论 Kafka 消费者组频繁 rebalance 的问题，原因是单条消息处理时间超过 max.poll.interval.ms，助手建议调大参数并把耗时处理改成异步。"),
    "l07": (LIN, "p2p", "用户在准备下周的技术分享，主题是订单系统的分库分表实践，助手帮忙列了提纲：为什么拆、按 user_id 取模、跨分片查询、数据迁移踩坑。"),
    "l08": (LIN, "p2p", "用户抱怨最近加班太多，周末也在处理线上告警，感觉很累，助手建议和主管沟通 on-call 轮值，并给自己留出运动时间。"),
    "l09": (LIN, "group", "用户在做 Kubernetes 上的服务部署，Pod 一直 CrashLoopBackOff 反复重启，最后发现是 liveness probe 的超时时间太短，服务启动要 40 秒。"),
    "l10": (LIN, "p2p", "用户计划国庆带父母去云南旅游，讨论了昆明、大理、丽江的路线，考虑到父母年纪大，助手建议每个城市多住一天，避开玉龙雪山的高海拔项目。"),
    "l11": (LIN, "p2p", "用户遇到 MySQL 主从复制延迟导致读到旧数据的问题，助手建议关键读请求走主库，并介绍了半同步复制和 GTID。"),
    "l12": (LIN, "p2p", "用户在面试后端候选人，想设计一道考察并发的面试题，助手提议让候选人实现一个带过期时间的限流器，并给出评分要点。"),
    "l13": (LIN, "p2p", "用户咨询买房还是继续租房，在杭州看中一套两居室，首付压力较大，助手帮他算了月供占收入的比例和机会成本。"),
    "l14": (LIN, "group", "用户的 CI 流水线很慢，单元测试要跑 25 分钟，助手建议按包并行执行测试、缓存 Go module 依赖、把集成测试拆到夜间任务。"),
    "l15": (LIN, "p2p", "用户和助手复盘了上周支付回调重复导致重复发货的线上事故，根因是回调接口没有做幂等，后续加了基于订单号的唯一约束。"),
    "l16": (LIN, "p2p", "用户最近开始跑步，想在明年春天跑完第一个半程马拉松，助手给了一个 16 周的训练计划，每周三次跑步加一次力量训练。"),
    "l17": (LIN, "group", "用户问订单服务的接口文档怎么写，助手建议用 OpenAPI 规范描述订单查询和订单创建接口，再用 Swagger 生成文档页面。"),
    "l18": (LIN, "group", "用户想给团队引入代码评审规范，讨论了 PR 大小限制、两人审批和自动化 lint 检查，避免评审流于形式。"),
    "l19": (LIN, "p2p", "用户在调研分布式事务方案，比较了 TCC、Saga 和本地消息表，订单服务和库存服务之间最后选了本地消息表加 Kafka。"),
    "l20": (LIN, "p2p", "用户的 MySQL 数据库磁盘快满了，助手建议把半年前的订单数据归档到冷存储，并清理过期的 binlog。"),
    # Emma: product manager at a SaaS start-up
    "e01": (EMMA, "p2p", "Emma drafted the PRD for the new onboarding checklist feature; the assistant suggested measuring activation as completing three key setup steps within 7 days and cutting the scope of the template gallery."),
    "e02": (EMMA, "p2p", "Emma prepared for a difficult conversation with an engineer who keeps missing sprint commitments; they role-played the one-on-one and agreed to focus on specific examples instead of blame."),
    "e03": (EMMA, "p2p", "Emma analysed churn for the SMB segment: most cancellations happen in the first 60 days, often after a failed Slack integration setup. The assistant proposed an in-app health score for small business accounts."),
    "e04": (EMMA, "p2p", "Emma planned a two-week trip to Japan in April: Tokyo, Kyoto and Hiroshima with a JR Pass; the assistant suggested booking a ryokan in Kyoto early because of cherry blossom season."),
    "e05": (EMMA, "p2p", "Emma asked for help writing the quarterly board update: ARR grew 18%, the burn multiple improved, and the main risk is the delayed enterprise SSO feature."),
    "e06": (EMMA, "group", "Emma compared Amplitude and Mixpanel for product analytics; pricing by event volume, group analytics for B2B accounts and the warehouse-native option weighed most."),
    "e07": (EMMA, "p2p", "Emma is training for her first Olympic-distance triathlon; open-water swimming makes her anxious, so the assistant suggested practising with a group and doing breathing drills."),
    "e08": (EMMA, "group", "Emma prioritised the Q3 roadmap with RICE scoring; enterprise SSO and audit logs ranked highest, and the dark mode request was deferred."),
    "e09": (EMMA, "p2p", "Emma wrote user interview questions to discover why admins don't invite teammates; the assistant warned against leading questions and suggested asking about the last time they invited someone."),
    "e10": (EMMA, "p2p", "Emma was stressed that her manager is leaving the company and worried about who would champion her projects; they talked about building a relationship with the new VP."),
    "e11": (EMMA, "p2p", "Emma designed a pricing page experiment defaulting the toggle to annual vs monthly billing, with a sample size calculation to detect a 2-point lift in annual plan conversion."),
    "e12": (EMMA, "p2p", "Emma asked for a sourdough bread recipe; her starter was sluggish, so the assistant suggested feeding it twice a day somewhere warmer and doing an overnight cold proof."),
    "e13": (EMMA, "group", "Emma reviewed the enterprise SSO launch plan with SAML and SCIM provisioning; they agreed on a beta with three customers and a support runbook before general availability."),
    "e14": (EMMA, "p2p", "Emma wanted book recommendations on product strategy; the assistant suggested Good Strategy Bad Strategy, Inspired and Escaping the Build Trap."),
    "e15": (EMMA, "group", "Emma's team debated whether to build the Microsoft Teams integration before improving the Slack integration; customer requests and the enterprise deal pipeline favoured Teams."),
    "e16": (EMMA, "p2p", "Emma set up a weekly metrics review for the product team: activation, retention and expansion revenue, each metric with one owner and a target for the quarter."),
    # 赵: final-year student, then a new product assistant
    "z01": (ZHAO, "p2p", "用户大四，正在纠结毕业后考研还是直接工作，家里希望她考研，她自己更想去互联网公司做产品，助手帮她列了两条路的利弊。"),
    "z02": (ZHAO, "p2p", "用户最近失眠，晚上睡不着，躺下后脑子停不下来，总在想论文进度，助手建议睡前一小时不看手机、写下第二天的待办清单，并尝试 4-7-8 呼吸法。"),
    "z03": (ZHAO, "p2p", "用户和室友因为作息不同闹矛盾，室友经常凌晨打游戏很吵，助手建议先平静地约一个时间谈，提出具体的安静时段，而不是直接抱怨。"),
    "z04": (ZHAO, "p2p", "用户想学做饭，从番茄炒蛋和可乐鸡翅开始，助手讲了火候和调味的顺序，建议先备好所有食材再开火。"),
    "z05": (ZHAO, "p2p", "用户在准备字节跳动产品经理的面试，练习了设计一个校园二手交易平台的产品设计题，助手帮她梳理了目标用户和核心流程。"),
    "z06": (ZHAO, "p2p", "用户的毕业论文研究短视频平台的用户留存，卡在文献综述，助手建议按理论框架分类整理文献，并推荐用 Zotero 管理引用。"),
    "z07": (ZHAO, "p2p", "用户养了一只橘猫叫年糕，最近不爱吃东西还呕吐毛球，助手建议喂化毛膏、多给猫梳毛，如果持续两天以上就去宠物医院。"),
    "z08": (ZHAO, "p2p", "用户感到很焦虑，觉得同学都拿到了 offer 只有自己没有，助手倾听后帮她把焦虑拆成能做的事：每周投递简历的数量和面试复盘。"),
    "z09": (ZHAO, "p2p", "用户计划毕业旅行去成都和重庆，想吃火锅和看大熊猫，助手建议去成都大熊猫繁育基地要早上七点半前到，重庆可以坐长江索道。"),
    "z10": (ZHAO, "p2p", "用户拿到了两个 offer，一个是上海大厂的产品助理，一个是杭州创业公司的产品经理，助手帮她比较了薪资、成长空间和城市生活成本。"),
    "z11": (ZHAO, "p2p", "用户和妈妈吵架了，妈妈不同意她去外地工作，她觉得很委屈，助手陪她聊了聊，建议找个时间给妈妈写信表达自己的想法。"),
    "z12": (ZHAO, "p2p", "用户开始找房子租，看了几套，纠结通勤时间和房租，助手建议通勤控制在 45 分钟以内，并提醒签租房合同前检查押金条款和水电费。"),
    "z13": (ZHAO, "p2p", "用户想坚持健身但总是三天打鱼两天晒网，助手建议从每周两次 30 分钟的居家训练开始，用打卡表记录。"),
    "z14": (ZHAO, "p2p", "用户第一天入职，对新环境很紧张，怕问太多问题显得能力不够，助手鼓励她新人多问是正常的，建议把问题攒起来集中请教导师。"),
    "z15": (ZHAO, "p2p", "用户租的房子热水器坏了，房东一直拖着不修，助手建议先看租房合同里的维修条款，再通过微信发消息留下证据。"),
    "z16": (ZHAO, "p2p", "用户问面试结束后要不要给面试官发感谢信，助手说不是必须的，并给了一个简短真诚的模板。"),
    # Raj: data scientist, writes Chinese and English
    "r01": (RAJ, "p2p", "Raj 在训练一个用户流失预测模型（churn model），XGBoost 的 AUC 只有 0.71，助手建议做特征工程：最近 30 天活跃天数、客服工单数，并检查 label leakage。"),
    "r02": (RAJ, "p2p", "Raj asked how to deploy the churn model as a daily batch scoring job on Airflow writing predictions to BigQuery; they discussed model versioning with MLflow."),
    "r03": (RAJ, "p2p", "Raj 用 pandas 处理 2 亿行日志太慢，助手建议改用 Polars 或 DuckDB，并把日志按日期分区存成 Parquet。"),
    "r04": (RAJ, "group", "Raj designed an A/B test for the new recommendation algorithm; the assistant explained CUPED variance reduction and warned about novelty effects in the first week."),
    "r05": (RAJ, "p2p", "Raj 在学中文，想练习口语，助手帮他纠正了「我对这个很感兴趣」和「我有兴趣这个」的区别，并推荐了 HelloTalk 找语伴。"),
    "r06": (RAJ, "p2p", "Raj planned a Diwali dinner for colleagues in Shanghai; they worked out where to buy spices and adapted the recipes for biryani and paneer butter masala."),
    "r07": (RAJ, "group", "Raj 的 LLM 文本分类项目：用 embedding 加逻辑回归给客服工单分类，准确率 87%，助手建议对低置信度样本人工复核并做主动学习。"),
    "r08": (RAJ, "p2p", "Raj was preparing a talk on causal inference for the data team: difference-in-differences, synthetic control, and what to do when an A/B test is not possible."),
    "r09": (RAJ, "p2p", "Raj 的 Spark 作业 OOM，发现是 groupBy 之后数据倾斜，某个 key 占了 40% 的数据，助手建议加盐打散再聚合。"),
    "r10": (RAJ, "p2p", "Raj 想给孩子选双语幼儿园，比较了学费、通勤和中英文教学比例，助手建议带孩子去试听一节课。"),
    "r11": (RAJ, "p2p", "Raj came back to the churn model: retraining it monthly made the score distribution drift, so the assistant suggested monitoring PSI and calibrating with isotonic regression."),
    "r12": (RAJ, "p2p", "Raj asked how to explain the churn model's AUC to business stakeholders; they settled on a lift chart and precision in the top 10% of scored customers instead."),
    "r13": (RAJ, "group", "Raj 在整理团队的数据字典，把 BigQuery 里的表按业务域打标签，并给关键字段补上注释和负责人。"),
}

# (user, query, relevant labels)
QUERIES: list[tuple[str, str, tuple[str, ...]]] = [
    (LIN, "数据库慢查询又出现了，上次加索引那个怎么做的", ("l01",)),
    (LIN, "MySQL 主从延迟又读到旧数据", ("l11",)),
    (LIN, "redis 集群迁移的方案再看一下", ("l02",)),
    (LIN, "goroutine 泄漏又来了", ("l04",)),
    (LIN, "Kubernetes 部署的 pod 又一直重启", ("l09",)),
    (LIN, "kafka 消费者又在 rebalance", ("l06",)),
    (LIN, "分库分表的技术分享提纲", ("l07",)),
    (LIN, "带爸妈去云南玩的行程", ("l10",)),
    (LIN, "半程马拉松训练计划", ("l16",)),
    (LIN, "支付回调的事故复盘", ("l15",)),
    (LIN, "杭州那套房子的首付", ("l13",)),
    (LIN, "CI 跑得太慢了", ("l14",)),
    (LIN, "上次那道限流器面试题", ("l12",)),
    (LIN, "最近又一直加班，好累", ("l08",)),
    (EMMA, "onboarding checklist activation metric", ("e01",)),
    (EMMA, "SSO launch beta customers", ("e13", "e08", "e05")),
    (EMMA, "Japan trip cherry blossoms", ("e04",)),
    (EMMA, "churn in small business accounts", ("e03",)),
    (EMMA, "the engineer who misses sprint commitments again", ("e02",)),
    (EMMA, "Amplitude vs Mixpanel pricing", ("e06",)),
    (EMMA, "my sourdough starter is slow again", ("e12",)),
    (EMMA, "open water swim anxiety before the triathlon", ("e07",)),
    (EMMA, "annual billing toggle experiment results", ("e11",)),
    (EMMA, "my manager is leaving, what now", ("e10",)),
    (ZHAO, "又睡不着了，一直在想论文", ("z02",)),
    (ZHAO, "年糕又吐了", ("z07",)),
    (ZHAO, "两个 offer 到底怎么选", ("z10",)),
    (ZHAO, "室友又在半夜打游戏", ("z03",)),
    (ZHAO, "租房的押金条款", ("z12",)),
    (ZHAO, "产品经理面试的产品设计题", ("z05",)),
    (ZHAO, "文献综述写不下去", ("z06",)),
    (ZHAO, "又和妈妈吵架了", ("z11",)),
    (RAJ, "churn model", ("r01", "r02", "r11", "r12")),
    (RAJ, "Spark 数据倾斜又 OOM 了", ("r09",)),
    (RAJ, "pandas is too slow on the big logs", ("r03",)),
    (RAJ, "causal inference talk", ("r08",)),
    (RAJ, "CUPED for the A/B test", ("r04",)),
    (RAJ, "双语幼儿园", ("r10",)),
    # harder: paraphrases, words shared with other episodes, several relevant episodes
    (LIN, "线上又出事故了，这次也是重复发货", ("l15",)),
    (LIN, "订单表的查询很慢", ("l01",)),
    (LIN, "订单", ("l01", "l07", "l15", "l17", "l19", "l20")),
    (LIN, "rust 入门看什么书", ("l05",)),
    (LIN, "季度 OKR 的关键结果怎么拆", ("l03",)),
    (LIN, "数据库的读写延迟", ("l11", "l01")),
    (EMMA, "what did we decide about the template gallery", ("e01",)),
    (EMMA, "help me prepare the next board update", ("e05",)),
    (EMMA, "enterprise SSO", ("e13", "e08", "e05")),
    (EMMA, "interview questions about inviting teammates", ("e09",)),
    (EMMA, "books about strategy", ("e14",)),
    (ZHAO, "考研还是工作", ("z01",)),
    (ZHAO, "第一天上班好紧张", ("z14",)),
    (ZHAO, "健身总是坚持不下来", ("z13",)),
    (ZHAO, "offer", ("z10", "z08")),
    (ZHAO, "成都旅游攻略", ("z09",)),
    (RAJ, "客服工单分类的准确率", ("r07",)),
    (RAJ, "model drift after monthly retraining", ("r11",)),
    (RAJ, "where to buy spices in Shanghai", ("r06",)),
    (RAJ, "中文口语练习", ("r05",)),
    (LIN, "分布式事务选型", ("l19",)),
    (LIN, "MySQL 磁盘又快满了", ("l20",)),
    (EMMA, "Slack integration setup failures", ("e03",)),
    (ZHAO, "房东不修热水器", ("z15",)),
    # long messages, the way people actually write in chat
    (LIN, "还记得上次我们聊的那个 MySQL 慢查询吗？大促又要来了，我担心订单服务的数据库又扛不住", ("l01",)),
    (LIN, "下周要跟组里分享一下我们拆库拆表的经验，之前那个提纲你再帮我过一遍", ("l07",)),
    (EMMA, "I'm meeting the new VP next week and I'm still nervous about who will back my projects now that my manager is gone", ("e10",)),
    (EMMA, "we launched the checklist last week, how should I measure whether new users actually get activated?", ("e01",)),
    (ZHAO, "我又开始焦虑了，身边的同学好像都拿到 offer 了，就我还没有着落", ("z08",)),
    (ZHAO, "年糕这两天又不怎么吃东西了，要不要带它去医院", ("z07",)),
    (RAJ, "the churn scores look weird again after this month's retrain, should I recalibrate?", ("r11",)),
    (RAJ, "我们的 Spark 任务又挂了，好像还是某个 key 太多导致的", ("r09",)),
]

# (user, message about nothing this user has talked about)
UNRELATED: list[tuple[str, str]] = [
    (LIN, "你好"),
    (LIN, "帮我写一首关于秋天的诗"),
    (LIN, "今天晚上吃什么好"),
    (LIN, "给我讲个笑话吧"),
    (LIN, "Python 的装饰器怎么写"),
    (LIN, "翻译一下 good morning"),
    (EMMA, "hi there"),
    (EMMA, "what's the capital of Australia?"),
    (EMMA, "write a haiku about coffee"),
    (EMMA, "can you explain how vaccines work"),
    (EMMA, "thanks, that's all for today"),
    (ZHAO, "早上好"),
    (ZHAO, "推荐一部好看的电影"),
    (ZHAO, "水彩画怎么入门"),
    (ZHAO, "帮我查一下明天北京的天气"),
    (RAJ, "what is the time complexity of quicksort"),
    (RAJ, "推荐一首好听的歌"),
    (RAJ, "how do I make a good cup of masala chai"),
    (RAJ, "帮我写一封请假邮件"),
    # sharing one incidental word with an episode, about something else
    (LIN, "周末想去看电影，有推荐吗"),
    (LIN, "go 语言的泛型怎么用"),
    (LIN, "帮我写个正则表达式匹配手机号"),
    (EMMA, "can you proofread this email to a customer"),
    (EMMA, "plan a birthday party for my niece"),
    (ZHAO, "周末想去爬山，带什么装备"),
    (ZHAO, "推荐几本好看的小说"),
    (RAJ, "how do I write a unit test in pytest"),
    (RAJ, "数据可视化用什么库好"),
]

USERS = (LIN, EMMA, ZHAO, RAJ)


async def load(store, *, base_time: float = 1_750_000_000.0) -> dict[str, int]:
    """Write every episode (session id = label) and return {label: episode id}."""
    ids: dict[str, int] = {}
    for i, (label, (user, chat_type, summary)) in enumerate(EPISODES.items()):
        ep = await store.write(
            session_id=label, user_id=user, chat_id=f"oc_{user}_{chat_type}", chat_type=chat_type,
            summary=summary, turn_count=4 + i % 7, model="claude-haiku-4-5", timestamp=base_time + i * 3600,
        )
        ids[label] = ep.id
    return ids


def recall_at(results: list[str], relevant: tuple[str, ...], k: int = 3) -> float:
    """Fraction of the relevant episodes found in the top k (relevant sets have ≤ k items)."""
    return len(set(results[:k]) & set(relevant)) / min(len(relevant), k)


async def evaluate(store, label_of: dict[int, str], *, method: str, k: int = 3) -> tuple[float, list[tuple[str, list[str]]]]:
    """Mean recall@k over QUERIES, and the misses (query, top k labels)."""
    total = 0.0
    misses = []
    for user, query, relevant in QUERIES:
        hits = await store.search(user, query, limit=k, method=method)
        labels = [label_of[h.id] for h in hits]
        r = recall_at(labels, relevant, k)
        total += r
        if r < 1.0:
            misses.append((query, labels))
    return total / len(QUERIES), misses
