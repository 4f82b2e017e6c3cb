"""Pure parsers for kernel text files: text in, frozen dataclasses out, no I/O."""
