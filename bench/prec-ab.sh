#!/bin/bash
# A precision change against the binary before it, on one GPU in one call (~4 minutes on an
# H200): test_ops, the DeltaNet fixtures' checks at chunks 64 and 1, decode at ctx 0 (Q4_K, MLX4,
# the bf16 12-layer slice) by carry/gpu/ab/base.xz (an sm_90a build of the older commit, strip,
# xz -9e) and the new toasted, two rounds, and the 17K prompt by each. Carry carry/gpu.
# AB_DECODE=0: no decode rounds (a prefill-only change); AB_ROUNDS=N: the 17K prompt N times by each.
. bench/gpu-env.sh; sh tools/unpack-testdata.sh tests/data build/testdata >/dev/null
python3 -c 'import lzma, sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())' carry/gpu/ab/base.xz >$B/base; chmod +x $B/base
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 250 $B/test_ops > $OUT/test_ops.log 2>&1; echo "test_ops rc=$? $(grep -c failed $OUT/test_ops.log) failures; $(grep 'cuda: products' $OUT/test_ops.log); $(tail -1 $OUT/test_ops.log)"; grep failed $OUT/test_ops.log | head
for m in qwen35-tiny qwen3next-odd qwen3next-tiny qwen35moe-odd qwen3-tiny; do for c in 64 1; do echo "$m $c: $($B/toasted check build/testdata/models/$m --backend cuda --chunk $c 2>&1 | grep -E '^ids|^greedy' | sed 's/mean KL [^,]*, //' | tr '\n' ' ')"; done; done
[ "${AB_DECODE:-1}" = 0 ] || for r in 1 2; do for b in base toasted; do for t in "--type q4_k" "--type mlx4" "--layers 12"; do echo "r$r $b $t: $(timeout 100 $B/$b bench --synthetic qwen3-next-80b-a3b $t --backend cuda --prompt 1 --ctx 0 --decode 64 2>&1 | awk '/^[0-9]+ +[0-9.]+ +[0-9.]+/ {printf "ctx%s %s tok/s (%sx floor)  ", $1, $2, $6}')"; done; done; done
for r in $(seq ${AB_ROUNDS:-1}); do for b in base toasted; do for t in "--type q4_k --chunk 32768" "--layers 12"; do echo "r$r $b $t 17K: $(timeout 100 $B/$b bench --synthetic qwen3-next-80b-a3b $t --backend cuda --prompt 17408 --ctx 0 --decode 1 2>&1 | awk '/^prefill/ {printf "%s ms, %s x GEMM", $4, $7}')"; done; done; done
