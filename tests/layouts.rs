//! `tessera ingest --input` on the layouts people train on, made from crops of real photographs
//! (`tessera synth --photos`, then `tests/support/layouts.py` writes them with pyarrow): the
//! same eight samples as the_cauldron's parquet, TRL's `messages` parquet and LLaVA-OneVision's
//! json, with 1-, 2- and 3-image rows, multi-turn rows, a text-only row, a row with corrupt
//! image bytes, a row whose images do not match its placeholders, and (json, messages) a video.
//! Each layout is detected, ingests to exactly the expected samples and rejections, and the
//! three give byte-identical shards. A parquet ingest killed with SIGKILL midway resumes to the
//! shards of an uninterrupted run. The loss of a three-turn conversation covers exactly its
//! assistant turns.
use anyhow::{ensure, Context, Result};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support;
use support::layouts::{layouts, python};
use support::{run_err, run_ok, tessera, tokenizer};

/// `tessera ingest --input INPUT ... --out OUT` (chatml: the samples are multi-turn).
fn ingest(input: &Path, out: &Path, extra: &[&str]) -> Command {
    let mut cmd = tessera();
    cmd.args(["ingest", "--quiet", "--input"])
        .arg(input)
        .arg("--tokenizer")
        .arg(tokenizer())
        .arg("--out")
        .arg(out)
        .args(["--template", "chatml", "--max-rejected-fraction", "0.5"])
        .args(extra);
    cmd
}

/// `(id, reason)` of each line of `rejected.jsonl`.
fn rejections(out: &Path) -> Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string(out.join("rejected.jsonl"))?;
    text.lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line)?;
            let field = |k: &str| v[k].as_str().map(str::to_string).context(k.to_string());
            Ok((field("id")?, field("reason")?))
        })
        .collect()
}

/// The shard files of `dir` with their bytes.
fn shard_files(dir: &Path) -> Result<BTreeMap<String, Vec<u8>>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path
            .file_name()
            .context("name")?
            .to_string_lossy()
            .into_owned();
        if name.starts_with("shard-") {
            out.insert(name, std::fs::read(&path)?);
        }
    }
    Ok(out)
}

fn index(dir: &Path) -> Result<serde_json::Value> {
    Ok(serde_json::from_slice(&std::fs::read(
        dir.join("index.json"),
    )?)?)
}

#[test]
fn three_layouts_ingest_to_the_same_samples_rejections_and_shard_bytes() -> Result<()> {
    let l = layouts(&[])?;
    let outs = [
        ("cauldron", l.root.join("from-cauldron")),
        ("messages", l.root.join("from-messages")),
        ("onevision", l.root.join("from-onevision")),
    ];
    // Each detected from the input: a folder of parquet with `texts`, a parquet file with
    // `messages`, a json with image lists and a video (its images in a folder beside it).
    run_ok(&mut ingest(&l.cauldron(), &outs[0].1, &[]))?;
    run_ok(&mut ingest(&l.messages(), &outs[1].1, &[]))?;
    run_ok(
        ingest(&l.onevision(), &outs[2].1, &[])
            .arg("--images")
            .arg(l.onevision_images()),
    )?;

    let rejected = |video: bool| {
        let mut want = vec![
            ("train:5".to_string(), "corrupt_image".to_string()),
            ("train:6".into(), "image_placeholder_mismatch".into()),
        ];
        if video {
            want.push(("train:8".into(), "video_unsupported".into()));
        }
        want
    };
    for (layout, out) in &outs {
        let video = *layout != "cauldron";
        assert_eq!(
            rejections(out)?,
            rejected(video),
            "{layout}: rejected.jsonl"
        );
        let index = index(out)?;
        assert_eq!(index["format_version"], 3, "{layout}");
        assert_eq!(
            index["ingest_settings"]["format"], *layout,
            "{layout}: detected"
        );
        let report = &index["ingest"];
        assert_eq!(
            report["records_read"],
            if video { 9 } else { 8 },
            "{layout}"
        );
        assert_eq!(report["samples_written"], 6, "{layout}");
        // 1 + 2 + 3 + 1 + 2 images kept, every one a JPEG.
        assert_eq!(report["image_formats"]["jpeg"], 9, "{layout}");
    }

    // What the shards hold: the kept samples in input order, each image's own bytes in
    // placeholder order, the turns with the images before the first user turn, roles by
    // their canonical names.
    let photo = |name: &str| std::fs::read(l.onevision_images().join(name));
    let dataset = tessera_shards::Dataset::open(&outs[0].1)?;
    let samples = dataset.read(&(0..dataset.len() as u64).collect::<Vec<_>>())?;
    let ids: Vec<&str> = samples.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(
        ids,
        ["train:0", "train:1", "train:2", "train:3", "train:4", "train:7"]
    );
    let photos_of = [
        vec![0],
        vec![1, 2],
        vec![3, 4, 5],
        vec![6],
        vec![],
        vec![10, 11],
    ];
    for (sample, photos) in samples.iter().zip(&photos_of) {
        assert_eq!(sample.images.len(), photos.len(), "{}", sample.id);
        for (image, p) in sample.images.iter().zip(photos) {
            ensure!(
                image.bytes == photo(&format!("p{p}.jpg"))?,
                "{}: image bytes differ from photo {p}",
                sample.id
            );
            assert_eq!(image.format, "jpeg");
        }
        let placeholders = sample
            .input_ids
            .iter()
            .filter(|&&t| t == tessera_text::SpecialTokens::qwen().image.id)
            .count();
        assert_eq!(
            placeholders,
            photos.len(),
            "{}: one placeholder per image",
            sample.id
        );
    }
    let turns: Vec<(&str, &str)> = samples[1]
        .conversation
        .iter()
        .map(|t| (t.role.as_str(), t.text.as_str()))
        .collect();
    assert_eq!(
        turns,
        [
            ("user", "<image><image>Compare the two photos."),
            ("assistant", "The first one is brighter.")
        ]
    );
    assert_eq!(samples[3].conversation.len(), 6, "three turns of two");

    let want = shard_files(&outs[0].1)?;
    ensure!(!want.is_empty(), "no shard written");
    for (layout, out) in &outs[1..] {
        ensure!(
            shard_files(out)? == want,
            "{layout}: shards differ from the_cauldron layout's"
        );
    }

    // The shards verify, pyarrow reads them, and stats count images per sample.
    let verified = run_ok(tessera().args(["shards", "verify"]).arg(&outs[0].1))?;
    ensure!(String::from_utf8_lossy(&verified.stdout).starts_with("ok:"));
    let checked = run_ok(
        Command::new(python())
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracles/check_pyarrow.py"))
            .arg(&outs[0].1),
    )?;
    ensure!(String::from_utf8_lossy(&checked.stdout).contains("pyarrow ok"));
    let stats = run_ok(
        tessera()
            .args(["shards", "stats", "--json"])
            .arg(&outs[0].1),
    )?;
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout)?;
    assert_eq!(stats["images"], 9);
    assert_eq!(
        stats["images_per_sample"],
        serde_json::json!({"1": 2, "2": 2, "3": 1})
    );

    three_turns_supervise_exactly_the_assistant_answers(&samples[3])?;

    // A format that does not fit the input is refused, naming both; the json layouts need
    // --images; `--json` still spells `--input`.
    let err = run_err(&mut ingest(
        &l.onevision(),
        &l.root.join("x"),
        &["--format", "cauldron"],
    ))?;
    ensure!(
        err.contains("is a json file") && err.contains("cauldron"),
        "{err}"
    );
    let err = run_err(&mut ingest(
        &l.messages(),
        &l.root.join("y"),
        &["--format", "cauldron"],
    ))?;
    ensure!(err.contains("no `texts` column"), "{err}");
    let err = run_err(&mut ingest(&l.onevision(), &l.root.join("z"), &[]))?;
    ensure!(err.contains("give --images"), "{err}");
    let spelled = l.root.join("spelled-json");
    let mut cmd = tessera();
    cmd.args(["ingest", "--quiet", "--json"])
        .arg(l.onevision())
        .arg("--images")
        .arg(l.onevision_images())
        .arg("--tokenizer")
        .arg(tokenizer())
        .args([
            "--template",
            "chatml",
            "--max-rejected-fraction",
            "0.5",
            "--out",
        ])
        .arg(&spelled);
    run_ok(&mut cmd)?;
    ensure!(shard_files(&spelled)? == want, "--json spells --input");
    // A finished parquet ingest resumed with the same input is left as it is.
    run_ok(&mut ingest(&l.cauldron(), &outs[0].1, &["--resume"]))?;
    ensure!(shard_files(&outs[0].1)? == want);

    // Without --template a chat layout takes chatml, its own: the same shards. Given the
    // plain template, its multi-turn rows are refused and the stop names the flag to use.
    let bare = |out: &Path, extra: &[&str]| {
        let mut cmd = tessera();
        cmd.args(["ingest", "--quiet", "--input"])
            .arg(l.cauldron())
            .arg("--tokenizer")
            .arg(tokenizer())
            .args(extra)
            .arg("--out")
            .arg(out);
        cmd
    };
    let default_template = l.root.join("cauldron-default-template");
    run_ok(&mut bare(
        &default_template,
        &["--max-rejected-fraction", "0.5"],
    ))?;
    ensure!(
        shard_files(&default_template)? == want,
        "chatml is the cauldron default"
    );
    ensure!(index(&default_template)?["template"] == "chatml");
    let err = run_err(&mut bare(
        &l.root.join("plain"),
        &["--template", "plain", "--max-rejected-fraction", "0.01"],
    ))?;
    ensure!(
        err.contains("bad_conversation") && err.contains("need --template chatml"),
        "{err}"
    );
    Ok(())
}

/// The three-turn sample (one image) through the loader: its ids are the chatml text built
/// here piece by piece (special tokens by id, the text between them tokenized alone, the image
/// placeholder expanded to 4 tokens), and the positions that carry loss are exactly those whose
/// next token belongs to an assistant answer or the `<|im_end|>` closing it: not the system or
/// user turns, the image, the role headers or the newlines between turns.
fn three_turns_supervise_exactly_the_assistant_answers(
    sample: &tessera_shards::Sample,
) -> Result<()> {
    use tessera_pipeline::loader::{Loader, LoaderConfig};
    let encoder = tessera_text::Encoder::load(&tokenizer(), tessera_text::chat::Template::Chatml)?;
    let special = |token: &str| -> Result<i64> {
        let id = encoder.tokenizer().token_to_id(token);
        Ok(i64::from(
            id.with_context(|| format!("{token} in the tokenizer"))?,
        ))
    };
    let text = |s: &str| -> Result<Vec<i64>> {
        let ids = encoder
            .tokenizer()
            .encode(s, false)
            .map_err(anyhow::Error::msg)?;
        Ok(ids.get_ids().iter().map(|&t| i64::from(t)).collect())
    };
    const TOKENS: usize = 4;
    let image = vec![i64::from(encoder.tokens.image.id); TOKENS];
    let (start, end) = (special("<|im_start|>")?, special("<|im_end|>")?);
    let turns = [
        ("Describe the photo.", "Trees by the water."),
        ("What season is it?", "Autumn, by the colours."),
        ("Is it sunny?", "No, the light is soft."),
    ];
    // (ids, whether they are targets), in order.
    let mut pieces: Vec<(Vec<i64>, bool)> = Vec::new();
    for (t, (question, answer)) in turns.iter().enumerate() {
        pieces.push((vec![start], false));
        pieces.push((text("user\n")?, false));
        if t == 0 {
            let framed = [
                vec![special("<|vision_start|>")?],
                image.clone(),
                vec![special("<|vision_end|>")?],
            ];
            pieces.push((framed.concat(), false));
        }
        pieces.push((text(question)?, false));
        pieces.push((vec![end], false));
        pieces.push((text("\n")?, false));
        pieces.push((vec![start], false));
        pieces.push((text("assistant\n")?, false));
        pieces.push((text(answer)?, true));
        pieces.push((vec![end], true));
        pieces.push((text("\n")?, false));
    }
    let ids: Vec<i64> = pieces.iter().flat_map(|(p, _)| p.clone()).collect();
    let target: Vec<bool> = pieces
        .iter()
        .flat_map(|(p, sup)| std::iter::repeat_n(*sup, p.len()))
        .collect();
    // Position t carries loss when token t + 1 is a target.
    let want: Vec<usize> = (0..ids.len() - 1).filter(|&t| target[t + 1]).collect();

    let config = LoaderConfig::builder()
        .threads(1)
        .image_tokens(TOKENS)
        .image_size(16)
        .tokens(&encoder.tokens)
        .build()?;
    let plan = tessera_pipeline::MicroBatchPlan {
        kind: tessera_shards::Kind::Image,
        rows: vec![vec![0]],
        zero_loss: false,
    };
    let source: std::sync::Arc<dyn tessera_pipeline::loader::SampleSource> =
        std::sync::Arc::new(vec![sample.clone()]);
    let mb = Loader::new(source, vec![plan], config)
        .next()
        .context("one micro-batch")??;
    assert_eq!(mb.input_ids, ids, "the ids of the three-turn chatml text");
    let got: Vec<usize> = (0..mb.labels.len())
        .filter(|&t| mb.labels[t] != tessera_pipeline::IGNORE_INDEX)
        .collect();
    assert_eq!(got, want, "positions carrying loss");
    for &t in &got {
        assert_eq!(
            mb.labels[t],
            ids[t + 1],
            "position {t} predicts the next token"
        );
    }
    // Three answers, each with its <|im_end|>: three runs of targets.
    let runs = got.windows(2).filter(|w| w[1] != w[0] + 1).count() + 1;
    assert_eq!(runs, 3);
    assert_eq!(got.len(), sample.num_supervised_tokens as usize);
    Ok(())
}

#[test]
fn a_parquet_ingest_killed_midway_resumes_to_the_same_shards() -> Result<()> {
    let l = layouts(&["--rows", "240"])?;
    let input = l.root.join("layouts/big/train.parquet");
    let flags = ["--shard-size", "150000", "--workers", "1"];
    let reference = l.root.join("reference");
    run_ok(&mut ingest(&input, &reference, &flags))?;

    let out = l.root.join("interrupted");
    for (attempt, kill_after_shard) in [2usize, 6].into_iter().enumerate() {
        let resume: &[&str] = if attempt == 0 { &[] } else { &["--resume"] };
        let mut child = ingest(&input, &out, &[&flags[..], resume].concat())
            .stderr(Stdio::null())
            .spawn()?;
        let marker = out.join(tessera_shards::shard_file_name(kill_after_shard));
        let deadline = Instant::now() + Duration::from_secs(60);
        while !marker.exists() && Instant::now() < deadline && child.try_wait()?.is_none() {
            std::thread::sleep(Duration::from_millis(2));
        }
        child.kill()?; // SIGKILL: no chance to clean up.
        child.wait()?;
        ensure!(
            !out.join("index.json").exists(),
            "attempt {attempt}: the run finished before it was killed"
        );
    }
    run_ok(&mut ingest(
        &input,
        &out,
        &[&flags[..], &["--resume"]].concat(),
    ))?;
    let (want, got) = (shard_files(&reference)?, shard_files(&out)?);
    ensure!(want.len() > 8, "expected many shards, got {}", want.len());
    ensure!(
        got == want,
        "resumed shards differ from an uninterrupted run"
    );
    assert_eq!(
        std::fs::read(out.join("rejected.jsonl"))?,
        std::fs::read(reference.join("rejected.jsonl"))?
    );
    assert_eq!(index(&out)?["ingest"], index(&reference)?["ingest"]);
    assert_eq!(index(&out)?["num_samples"], 240);
    Ok(())
}
