"""The `rigkit` subcommands, one module each: their options and run(args), calling the packages below."""
