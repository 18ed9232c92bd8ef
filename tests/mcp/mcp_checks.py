"""What both real-client MCP tests need: counted checks and reading tool results
across SDK versions. Imported by client_test.py and reclaim_test.py (Python puts
the script's folder on sys.path)."""

import json

_checks = 0


def check(cond, what):
    global _checks
    if not cond:
        raise AssertionError(f"check failed: {what}")
    _checks += 1


def checks_done():
    return _checks


def attr(obj, snake, camel):
    """Field access across SDK versions (2.x: snake_case, 1.x: camelCase)."""
    return getattr(obj, snake) if hasattr(obj, snake) else getattr(obj, camel)


def is_error(result):
    return bool(attr(result, "is_error", "isError"))


def text_of(result):
    return "".join(getattr(c, "text", "") for c in result.content)


async def ok_json(session, name, args=None):
    """Calls a tool that must succeed; returns its JSON answer."""
    r = await session.call_tool(name, args or {})
    check(not is_error(r), f"{name}({args}) succeeded: {text_of(r)[:300]}")
    return json.loads(text_of(r))
