"""Reading CLI11's --help output: the entries of its Options, Positionals and Subcommands
blocks (and vllmctl's footer), as the man-page and completion tests compare them."""

import re


def help_blocks(text):
    """CLI11's help as {heading: [entry names]} for Options, Positionals and Subcommands,
    plus the vllmctl footer's "Exit codes" and "Environment" and vllm-ref-engine's
    "Fault injection" group."""
    blocks = {}
    heading = None
    for line in text.splitlines():
        match = re.fullmatch(
            r"(Options|Positionals|Subcommands|Exit codes|Environment|Fault injection):", line)
        if match:
            heading = match.group(1)
            blocks[heading] = []
            continue
        if not line.strip():
            heading = None
            continue
        # An entry: two spaces, its name, then type/default/description. Continuation lines
        # (descriptions wrapped under a long option) are indented further.
        entry = re.match(r"  (\S+)", line)
        if heading is not None and entry and not line.startswith("   "):
            blocks[heading].append(entry.group(1))
    return blocks


def flag_names(blocks):
    """Every flag name of the Options block: '-o,--output' gives '-o' and '--output'."""
    return [name for entry in blocks.get("Options", []) for name in entry.split(",")]
