//! AdamW: ATen's fused kernel (what CUDA runs) against the elementwise update (what the CPU
//! runs), both on the CPU where ATen has the fused kernel too; and the CPU keeps the latter.
use super::flat_param::{FlatBuffer, FlatEntry};
use super::optim::{AdamWConfig, ParamGroup, ShardedAdamW};
use tch::{Device, Kind, Tensor};

/// One trainable buffer of two parameters ("proj.weight" in a group of its own lr and weight
/// decay), this rank's shard (a copy of `start`) being elements [3, 13) of 16.
fn buffer(start: &Tensor) -> FlatBuffer {
    let entries = vec![
        FlatEntry {
            name: "proj.weight".into(),
            shape: vec![2, 4],
            offset: 0,
            numel: 8,
        },
        FlatEntry {
            name: "lora_A.weight".into(),
            shape: vec![2, 3],
            offset: 8,
            numel: 6,
        },
    ];
    FlatBuffer {
        unit_name: "unit".into(),
        trainable: true,
        expert: None,
        entries,
        numel: 14,
        padded: 16,
        shard_len: 10,
        shard_start: 3,
        shard: start.copy(),
        compute_kind: Kind::Float,
    }
}

fn config() -> AdamWConfig {
    AdamWConfig {
        lr: 1e-2,
        weight_decay: 0.1,
        groups: vec![ParamGroup {
            name: "proj".into(),
            unit_prefixes: vec![],
            name_contains: vec!["proj".into()],
            lr: 3e-3,
            weight_decay: 0.0,
        }],
        ..AdamWConfig::default()
    }
}

/// Parameter and moments after one update per gradient in `grads`, through the elementwise
/// path or whatever `update` picks on this device. The inputs are drawn once by the caller:
/// the global RNG is shared with tests running on other threads, so a seed set here would not
/// give both paths the same numbers.
fn run(elementwise: bool, start: &Tensor, grads: &[Tensor]) -> Vec<Tensor> {
    let buffers = vec![buffer(start)];
    let mut adamw = ShardedAdamW::new(config(), &buffers);
    for (step, grad) in grads.iter().enumerate() {
        let grads = vec![Some(grad.copy())];
        let lr_factor = 1.0 - step as f64 * 0.1;
        if elementwise {
            adamw.update_elementwise(&buffers, &grads, lr_factor);
        } else {
            adamw
                .update(&buffers, &grads, lr_factor)
                .expect("fused AdamW update");
        }
    }
    let s = &adamw.states[0];
    vec![
        buffers[0].shard.copy(),
        s.exp_avg.copy(),
        s.exp_avg_sq.copy(),
    ]
}

#[test]
fn fused_adamw_update_matches_the_elementwise_formula() {
    let options = (Kind::Float, Device::Cpu);
    let start = Tensor::randn([10], options);
    let grads: Vec<Tensor> = (0..5).map(|_| Tensor::randn([10], options)).collect();
    let plain = run(true, &start, &grads);
    let fused = run(false, &start, &grads);
    for (what, (a, b)) in ["param", "exp_avg", "exp_avg_sq"]
        .iter()
        .zip(plain.iter().zip(&fused))
    {
        let diff = (a - b).abs().max().double_value(&[]);
        assert!(diff <= 1e-6, "{what}: fused differs by {diff}");
    }
    // The parameters moved: the comparison is not between two untouched tensors.
    assert!((&plain[0] - &start).abs().max().double_value(&[]) > 1e-3);
}
