import sys

from bot.infra.cli import main

sys.exit(main())
