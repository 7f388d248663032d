# Schema validation of the configuration, before anything else: one line naming the key.
import sys

from fnlcore.app.plan import validate_schema
from fnlcore.errors import ConfigError

try:
    validate_schema(config)
except ConfigError as err:
    sys.stderr.write(f"\nConfiguration error: {err}\n\n")
    raise SystemExit(1)
