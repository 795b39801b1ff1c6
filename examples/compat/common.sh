# Sourced (never run) by the examples/compat/ scripts, after tools/cpu_env.sh:
#
#   source "$(dirname "${BASH_SOURCE[0]}")/../../tools/cpu_env.sh"
#   source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
#
# Environment:
#   COMPAT_DATA       tokenizers and datasets of tools/make_compat_data.py (default data/compat;
#                     made on first use, kept afterwards)
#   NUM_RANKS         CPU ranks the deepspeed launcher starts (default 2)
#   COMPAT_ARGS_FILE  when set, the script writes its entry point and flags there (each followed by
#                     a NUL byte) instead of launching: tests parse every flag in-process this way
# Defines compat_data (make the data) and compat_launch ENTRY_POINT FLAGS... (launch or write).
COMPAT_DATA=${COMPAT_DATA:-data/compat}
NUM_RANKS=${NUM_RANKS:-2}

compat_data() {
  "$PY" tools/make_compat_data.py --output-dir "$COMPAT_DATA" >&2
}

compat_launch() {
  local entry_point=$1
  shift
  if [ -n "${COMPAT_ARGS_FILE:-}" ]; then
    printf '%s\0' "$entry_point" "$@" > "$COMPAT_ARGS_FILE"
    return 0
  fi
  launch_with_port_retry "$DEEPSPEED" --num_gpus "$NUM_RANKS" "$entry_point" "$@"
}
