"""Entry points behind bin/aps-server, bin/aps-trainer and bin/aps-local."""
