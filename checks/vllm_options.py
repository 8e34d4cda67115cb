"""Print the options the image's `vllm serve` takes, as its own parser knows them; one JSON line.

Runs in a throw-away container of the image (fed on stdin). It imports vLLM and builds the `serve`
parser the way vLLM's CLI does (seconds: the caller caches the answer per image ID), then maps
every option string to the setting it writes (argparse's dest) and says whether the parser takes
abbreviations (allow_abbrev): bootstrap reads the words after `--` the way vLLM will
(serve/plan.check_extra_against).

Output: {"version": str, "options": {option: dest}, "abbrev": bool} or {"error": str}
"""
import json
import sys


def serve_parser():
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser
    parser = FlexibleArgumentParser(prog="vllm")
    try:
        from vllm.entrypoints.cli.serve import ServeSubcommand

        sub = parser.add_subparsers(dest="subparser")
        return ServeSubcommand().subparser_init(sub)
    except ImportError:  # older layouts: the OpenAI server's own parser
        from vllm.entrypoints.openai.cli_args import make_arg_parser

        return make_arg_parser(parser)


def main():
    try:
        import vllm

        p = serve_parser()
        opts = {o: a.dest for o, a in sorted(p._option_string_actions.items())}
        print(json.dumps({"version": getattr(vllm, "__version__", None), "options": opts,
                          "abbrev": bool(getattr(p, "allow_abbrev", True))}))
    except Exception as exc:  # any failure is an answer: the caller falls back to what it knows
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"[:500]}))


if __name__ == "__main__":
    sys.exit(main())
