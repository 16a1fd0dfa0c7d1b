import sys

from lmpress.cli.app import main

sys.exit(main())
