# Sourced after bench/gpu-env.sh by the scripts that run toasted under bench/cupti_trace.c
# (trace-decode.sh, trace-prefill.sh, timeline.sh): finds the machine's libcupti.so.13 for the
# loader (the script stops if there is none) and names the injection library in $CUPTI_TRACE.
lib=$(ls /usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13 /usr/local/cuda/lib64/libcupti.so.13 2>/dev/null | head -1)
[ -n "$lib" ] || lib=$(find / -xdev -name 'libcupti.so.13' 2>/dev/null | head -1)
[ -n "$lib" ] || { echo "$(basename "$0"): no libcupti.so.13 on this machine"; exit 1; }
export LD_LIBRARY_PATH=$(dirname "$lib"):$LD_LIBRARY_PATH
CUPTI_TRACE=$PWD/carry/gpu/lib/libcupti_trace.so
