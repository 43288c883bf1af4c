"""Suite-wide setup."""

import signal

# `./run test` runs tests/e2e as a background job of a non-interactive shell, which starts it with
# SIGINT ignored, and an ignored signal stays ignored across exec: every `swarm up` or `swarm chain`
# a test starts would then shrug off the Ctrl-C the test sends (exit 0, not 130). A handled signal
# is reset to the default on exec, so handling it here gives every child the usual Ctrl-C.
signal.signal(signal.SIGINT, signal.default_int_handler)
