"""The `lanes-es` command line: argument parsing and printing over the use cases."""
