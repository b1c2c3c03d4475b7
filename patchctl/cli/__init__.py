"""The command line: the command registry (main), the commands (commands/), their options, documents,
progress and the deployment file. Nothing below imports this layer."""
