import sys

from tensile_tf.cli import main

sys.exit(main())
