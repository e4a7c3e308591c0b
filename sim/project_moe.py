#!/usr/bin/env python3
"""Projects the MoE step to a GShard-like scale with pwm_sim --what moe (docs/simulator_moe.md,
"Mixture of Experts").

    sim/project_moe.py BUILD_DIR PROFILE [OUTDIR=results/sim] [--validation FILE=OUTDIR/validation.json]
                                                                   (~3 min: 2048 simulated ranks)

Writes OUTDIR/projection_moe.json and prints each variant's step and the ratios Pathways
controller / SPMD dropless and Pathways static / SPMD capacity. The controller's and workers'
costs are the profile's (this runtime's, unscaled), as in sim/project.py. What is taken from the
GShard paper and what is assumed is listed in ASSUMPTIONS and written with the results.
Each step and ratio is printed with a band: the range the validation's moe_* rows' signed errors
(sim_validate.sh's validation.json, mpi_scripts/sim_band.py; the training-step rows' when it has
no moe_* row) put around it. Without a validation file the projection stops (one line).
"""
import json, os, subprocess, sys

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(root, 'mpi_scripts'))
import sim_band
build, profile, out, validation = sim_band.projection_args('project_moe.py', sys.argv[1:])
try:
    band = sim_band.load_band(validation, ['moe_'], fallback=sim_band.STEP_ROWS)
except (OSError, ValueError, KeyError) as e:
    sys.exit(f'project_moe.py: error: no validation band ({e}): run mpi_scripts/sim_validate.sh first, or give --validation FILE')
exe = os.path.join(build, 'sim', 'pwm_sim')
if not os.access(exe, os.X_OK):
    sys.exit(f'project_moe.py: error: no {exe}: build it first (ninja -C {build} pwm_sim_cli)')
if not os.path.isfile(profile):
    sys.exit(f'project_moe.py: error: no profile {profile}: run mpi_scripts/sim_calibrate.sh first')

SOURCED = [
    'GShard (Lepikhin et al. 2020), its 600B model: 2048 experts on 2048 TPU v3 cores, top-2 gating, '
    'an MoE layer in every other block, expert capacity 2N/E per group (= --capacity-factor 1 with K = 2)',
    'TPU v3: 123 TFLOP/s bf16 peak per chip, two TensorCores per chip (Google Cloud TPU documentation)',
]
ASSUMPTIONS = [
    'shapes: d_model 1024, d_ff 8192, 36 layers, 16 heads of 64 (GShard 600B as we recall it, not checked here); '
    'decoder-only (GShard is an encoder-decoder); vocab 32000; sequences of 1024 tokens',
    'batch 4096 sequences (4M tokens) a step, one micro-batch: 2 sequences = 2048 tokens per core and routing group',
    'one expert per core (--expert-parallel 2048 = dp): no expert gradient is reduced',
    'dropless: balanced (--moe-imbalance 1); a capacity computes its padding rows',
    'a device computes at its peak FLOP/s (no MFU), the step plan of this project (no tp)',
    'ICI: each core its own port at 41 GB/s (half a chip\'s 656 Gbit/s), 1.5 us + 0.5 us a message; '
    'AllToAll and AllReduce as this project\'s algorithms over those links (sim/clusters/gshard_tpu_v3_cores.json)',
    'controller: this runtime (one message per worker, the profile\'s call/node/msg/fetch costs, unscaled), '
    'over a 12.5 GB/s, 10 us DCN link',
    'controller routing: the runtime fetches the [dp, E] int64 counts and puts 2E int64 on each device '
    '(what its block forward reads: Trainer::route), one message per device',
]
cfg = ['--d-model', '1024', '--layers', '36', '--heads', '16', '--head-dim', '64', '--d-ff', '8192',
       '--vocab', '32000', '--seq-len', '1024', '--batch', '4096', '--microbatches', '1',
       '--experts', '2048', '--top-k', '2', '--moe-every', '2', '--capacity-factor', '1',
       '--dp', '2048', '--expert-parallel', '2048', '--moe-imbalance', '1']
cluster = os.path.join(root, 'sim', 'clusters', 'gshard_tpu_v3_cores.json')
r = subprocess.run([exe, '--profile', profile, '--cluster', cluster, '--what', 'moe', *cfg],
                   capture_output=True, text=True)
if r.returncode != 0:
    sys.exit(f'project_moe.py: pwm_sim failed: {r.stderr.strip()}')
rows = [json.loads(l) for l in r.stdout.splitlines() if l.strip()]
layer = next(x for x in rows if x['what'] == 'moe_layer')
res = {'sourced': SOURCED, 'assumptions': ASSUMPTIONS, 'flags': cfg, 'profile': profile,
       'variants': [x for x in rows if x['what'] == 'moe'], 'layer': layer, 'band': band | {'validation': validation}}
for x in res['variants']:
    x['step_band_ms'] = sim_band.time_range(x['step_ms'], band)
for k in ('controller_over_spmd_dropless', 'worker_over_spmd_dropless', 'static_over_spmd_capacity'):
    layer[k + '_band'] = sim_band.ratio_range(layer[k], band)
os.makedirs(out, exist_ok=True)
json.dump(res, open(os.path.join(out, 'projection_moe.json'), 'w'), indent=1)
bt = sim_band.band_text
print(f'GShard-like MoE step (2048 experts, 2048 TPU v3 cores; assumptions in projection_moe.json; {sim_band.band_note(band)}):')
for x in res['variants']:
    print(f"  {x['variant']:32} step {x['step_ms']:10.1f} ms ({bt(*x['step_band_ms'], '{:.1f}')})  compute {x['compute_ms']:8.1f}  "
          f"alltoall {x['alltoall_ms']:7.1f}  round trips {x['round_trips']:3d} ({x['round_trip_ms']:.1f} ms)")
print(f"  per MoE layer: controller round trip {layer['round_trip_us'] / 1e3:.2f} ms against SPMD's AllToAlls "
      f"{(layer['spmd_dropless_alltoall_fwd_us'] + layer['spmd_dropless_alltoall_bwd_us'] + layer['spmd_counts_us']) / 1e3:.2f} ms")
print(f"  Pathways controller / SPMD dropless: {layer['controller_over_spmd_dropless']:.3f} "
      f"({bt(*layer['controller_over_spmd_dropless_band'], '{:.3f}')}; worker: {layer['worker_over_spmd_dropless']:.3f} "
      f"({bt(*layer['worker_over_spmd_dropless_band'], '{:.3f}')}))")
print(f"  Pathways static / SPMD capacity: {layer['static_over_spmd_capacity']:.3f} "
      f"({bt(*layer['static_over_spmd_capacity_band'], '{:.3f}')})")
