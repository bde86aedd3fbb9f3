import sys

from flamestream.cli import main

sys.exit(main())
