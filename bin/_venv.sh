# Sourced by bin/mqbox and bin/test: make sure .venv exists and holds what the caller needs.
# $1 is the pip extras to install ("" for run time only, "dev,interop" for the tests). The install
# runs again only when pyproject.toml or the extras change, so the common path costs one `cmp`.
set -euo pipefail
MQBOX_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$MQBOX_ROOT/.venv"

mqbox_python() {
    local candidate
    for candidate in "${MQBOX_PYTHON:-}" python3.11 python3; do
        [ -n "$candidate" ] || continue
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
    echo "mqbox: Python 3.11 or newer is needed (set MQBOX_PYTHON to its path)" >&2
    return 1
}

mqbox_venv() {
    local extras="$1" stamp want
    if [ ! -x "$VENV/bin/python" ]; then
        echo "mqbox: creating $VENV (first use)" >&2
        "$(mqbox_python)" -m venv "$VENV"
        "$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
    fi
    stamp="$VENV/.mqbox-installed"
    want="$(sha256sum "$MQBOX_ROOT/pyproject.toml" | cut -c1-16) extras=$extras"
    # An install that covers more extras also covers fewer: keep the widest one.
    if [ -f "$stamp" ] && { [ "$(cat "$stamp")" = "$want" ] ||
        { [ -z "$extras" ] && grep -q "^${want%% *} " "$stamp"; }; }; then
        return 0
    fi
    echo "mqbox: installing mqbox${extras:+[$extras]} into $VENV" >&2
    local spec="$MQBOX_ROOT"
    [ -n "$extras" ] && spec="$MQBOX_ROOT[$extras]"
    "$VENV/bin/python" -m pip install --quiet -e "$spec" >&2
    echo "$want" >"$stamp"
}
