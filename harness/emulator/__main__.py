import sys

from harness.emulator.serve import main

sys.exit(main())
