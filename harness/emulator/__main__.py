import sys

from harness.emulator.cli import main

sys.exit(main())
