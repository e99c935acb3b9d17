//! `anyres_max_N` token counts against transformers' `LlavaOnevisionProcessor` (the processor's
//! own counting, `tests/oracles/anyres_tokens.py`): tall, wide, square, tiny, huge and odd
//! sizes, N = 9 (LLaVA-OneVision's default) and N = 4, every count equal to the token, and the
//! same pinpoint chosen.
use std::path::Path;
use std::process::Command;
use tessera_shards::image_layout::{ImageLayout, Tower};

const SO400M: Tower = Tower {
    tile: 384,
    patch: 14,
};

/// (height, width) pairs of every shape: squares, 1:2 to 1:20 in both directions, tiny,
/// phone photos, 4K, odd numbers that leave an odd padding remainder.
fn sizes() -> Vec<(u32, u32)> {
    let mut sizes = vec![
        (384, 384),
        (20, 20),
        (1, 1),
        (1000, 300),
        (300, 1000),
        (4000, 3000),
        (3000, 4000),
        (2160, 3840),
        (3840, 2160),
        (640, 480),
        (480, 640),
        (333, 777),
        (777, 333),
        (1024, 1024),
        (8000, 400),
        (400, 8000),
        (2304, 2304),
        (2305, 1151),
        (97, 1601),
        (1601, 97),
    ];
    for k in [2u32, 3, 5, 7, 11, 20] {
        sizes.push((384 * k, 384));
        sizes.push((500, 500 * k));
    }
    sizes
}

#[test]
fn anyres_token_counts_equal_the_llava_onevision_processors() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = root.join(".deps/hfvenv/bin/python");
    let oracle = root.join("tests/oracles/anyres_tokens.py");
    let sizes = sizes();
    let args: Vec<String> = sizes.iter().map(|(h, w)| format!("{h}x{w}")).collect();
    for max_tiles in [9u32, 4] {
        let out = Command::new(&python)
            .arg(&oracle)
            .arg(max_tiles.to_string())
            .args(&args)
            .output()
            .unwrap_or_else(|e| panic!("{} did not run ({e}): run make setup", python.display()));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let want: Vec<(u32, u32, u64, u32, u32)> =
            serde_json::from_slice(&out.stdout).expect("the oracle's JSON");
        let layout: ImageLayout = format!("anyres_max_{max_tiles}").parse().expect("layout");
        for (h, w, tokens, best_h, best_w) in want {
            let got = layout.tokens(w, h, SO400M);
            assert_eq!(
                got.total(),
                tokens,
                "anyres_max_{max_tiles}, {h} x {w}: {got:?}"
            );
            assert_eq!(
                (got.grid.0 * 384, got.grid.1 * 384),
                (best_h, best_w),
                "{h} x {w}: pinpoint"
            );
        }
    }
}
