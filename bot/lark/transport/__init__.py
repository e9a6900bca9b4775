"""How Lark's events arrive: the webhook (verify, decrypt, route) and the long connection."""
