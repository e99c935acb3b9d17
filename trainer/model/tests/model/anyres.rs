//! `anyres_max_N` image features packed as transformers' `LlavaOnevisionModel.pack_image_features`
//! packs them (`tests/oracles/anyres_pack.py`, in f64): tall, wide, square, tiny, huge and odd
//! sizes, N = 9 and N = 4, and one image of a two-image sample; the same packed features, the
//! same gradients for the features and for `image_newline`, and as many rows as the planner
//! counts for the image.
use crate::support::*;
use tch::{Device, Kind, Tensor};
use tessera_fsdp::ParamMap;
use tessera_model::{load_safetensors, pack_image_features, save_safetensors};
use tessera_shards::image_layout::{ImageLayout, Tower};

const SO400M: Tower = Tower {
    tile: 384,
    patch: 14,
};
const DIM: i64 = 6;

/// (height, width): a tile-sized square, tiny, tall, wide, a 4:3 photo, 4K, a 1:20 strip, odd
/// sizes with an odd padding remainder, one that pools and one that does not.
const SIZES: [(u32, u32); 10] = [
    (384, 384),
    (20, 20),
    (1000, 300),
    (300, 1000),
    (3000, 4000),
    (2160, 3840),
    (8000, 400),
    (333, 777),
    (2305, 1151),
    (700, 800),
];

#[test]
fn packed_features_and_gradients_equal_transformers() {
    let side = i64::from(SO400M.side());
    for max_tiles in [9u32, 4] {
        let layout = ImageLayout::AnyRes { max_tiles };
        tch::manual_seed(i64::from(max_tiles));
        let f32s = (Kind::Float, Device::Cpu);
        let newline = Tensor::randn([DIM], f32s);
        let mut inputs = ParamMap::from([("newline".to_string(), newline.copy())]);
        let mut geometries = Vec::new();
        // Each size alone in its sample, and the last one as one of two images of a sample
        // (its base view and a newline).
        let images = SIZES.iter().map(|&s| (s, 1)).chain([(SIZES[9], 2)]);
        for (i, ((h, w), in_sample)) in images.enumerate() {
            let geometry = layout.tokens_in_sample(w, h, in_sample, SO400M);
            let tiles = i64::from(geometry.tiles);
            inputs.insert(
                format!("features.{i}"),
                Tensor::randn([tiles, side * side, DIM], f32s),
            );
            inputs.insert(
                format!("cotangent.{i}"),
                Tensor::randn([geometry.total() as i64, DIM], f32s),
            );
            inputs.insert(
                format!("size.{i}"),
                Tensor::from_slice(&[h as f32, w as f32]),
            );
            geometries.push(geometry);
        }
        let dir = tempfile::tempdir().expect("a temporary folder");
        let (src, dst) = (
            dir.path().join("in.safetensors"),
            dir.path().join("out.safetensors"),
        );
        save_safetensors(&src, &inputs).expect("writing the inputs");
        let out = std::process::Command::new(repo().join(".deps/hfvenv/bin/python"))
            .arg(repo().join("tests/oracles/anyres_pack.py"))
            .arg(max_tiles.to_string())
            .args([&src, &dst])
            .output()
            .expect("running tests/oracles/anyres_pack.py");
        assert!(
            out.status.success(),
            "the oracle failed (run scripts/setup/setup.sh for .deps/hfvenv): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let want = load_safetensors(&dst).expect("reading the oracle's outputs");
        let newline64 = newline.to_kind(Kind::Double).set_requires_grad(true);
        let mut loss = Tensor::zeros([], (Kind::Double, Device::Cpu));
        let mut leaves = Vec::new();
        for (i, geometry) in geometries.iter().enumerate() {
            let what = format!("image {i} under anyres_max_{max_tiles}");
            let features = get(&inputs, &format!("features.{i}"))
                .to_kind(Kind::Double)
                .set_requires_grad(true);
            let packed = pack_image_features(&features, geometry, side, Some(&newline64))
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_close(
                &packed.to_kind(Kind::Float),
                get(&want, &format!("packed.{i}")),
                1e-5,
                &format!("{what}: packed features"),
            );
            assert_eq!(
                packed.size()[0],
                geometry.total() as i64,
                "{what}: rows against the planner's tokens"
            );
            let cotangent = get(&inputs, &format!("cotangent.{i}")).to_kind(Kind::Double);
            loss += (&packed * cotangent).sum(Kind::Double);
            leaves.push((what, features));
        }
        loss.backward();
        for (i, (what, features)) in leaves.iter().enumerate() {
            assert_close(
                &features.grad().to_kind(Kind::Float),
                get(&want, &format!("grad_features.{i}")),
                1e-5,
                &format!("{what}: feature gradients"),
            );
        }
        assert_close(
            &newline64.grad().to_kind(Kind::Float),
            get(&want, "grad_newline"),
            1e-4,
            &format!("anyres_max_{max_tiles}: image_newline's gradient"),
        );
    }
}

#[test]
fn features_that_do_not_fit_the_geometry_are_refused_naming_the_shapes() {
    let side = i64::from(SO400M.side());
    let geometry = ImageLayout::AnyRes { max_tiles: 9 }.tokens(800, 600, SO400M);
    let features = Tensor::zeros([2, side * side, DIM], (Kind::Float, Device::Cpu));
    let newline = Tensor::zeros([DIM], (Kind::Float, Device::Cpu));
    let err = pack_image_features(&features, &geometry, side, Some(&newline))
        .expect_err("too few views")
        .to_string();
    assert!(
        err.contains("[2, 729, 6]") && err.contains(&format!("{} views", geometry.tiles)),
        "{err}"
    );
    let all = Tensor::zeros(
        [i64::from(geometry.tiles), side * side, DIM],
        (Kind::Float, Device::Cpu),
    );
    let err = pack_image_features(&all, &geometry, side, None)
        .expect_err("no image_newline")
        .to_string();
    assert!(err.contains("image_newline"), "{err}");
}
