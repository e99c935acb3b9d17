//! c10d collectives through the shim: 2 gloo ranks as 2 threads of this process.
use std::time::{Duration, Instant};
use tch::{Kind, Tensor};
use tessera_fsdp::dist::{local_groups, ProcessGroup};

/// Runs `body` on every rank's thread and returns each rank's result in rank order.
fn on_ranks<T: Send>(
    world: usize,
    timeout: Duration,
    body: impl Fn(ProcessGroup) -> anyhow::Result<T> + Sync,
) -> anyhow::Result<Vec<T>> {
    let groups = local_groups(world, timeout)?;
    std::thread::scope(|s| {
        let handles: Vec<_> = groups.into_iter().map(|pg| s.spawn(|| body(pg))).collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("rank thread panicked"))?
            })
            .collect()
    })
}

fn values(t: &Tensor) -> anyhow::Result<Vec<f32>> {
    Ok(Vec::<f32>::try_from(t.flatten(0, -1))?)
}

#[test]
fn two_ranks_all_gather_reduce_scatter_all_reduce_broadcast() -> anyhow::Result<()> {
    let results = on_ranks(2, Duration::from_secs(20), |pg| {
        let r = pg.rank() as f32;
        // all-gather: rank r contributes [10r, 10r+1, 10r+2]
        let shard = Tensor::from_slice(&[10.0 * r, 10.0 * r + 1.0, 10.0 * r + 2.0]);
        let mut full = Tensor::zeros([6], (Kind::Float, tch::Device::Cpu));
        pg.all_gather_into(&mut full, &shard, "toy")?.wait()?;
        // reduce-scatter: both ranks give [1..=4] * (r + 1); rank r keeps slice r of the sum
        let grads = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0]) * (r as f64 + 1.0);
        let mut mine = Tensor::zeros([2], (Kind::Float, tch::Device::Cpu));
        pg.reduce_scatter_into(&mut mine, &grads, "toy")?.wait()?;
        // all-reduce in place
        let mut sum = Tensor::from_slice(&[r + 1.0]);
        pg.all_reduce_sum(&mut sum, "loss")?.wait()?;
        // broadcast from rank 1
        let mut b = Tensor::from_slice(&[r, r]);
        pg.broadcast(&mut b, 1, "init")?.wait()?;
        pg.barrier("end")?;
        Ok((
            values(&full)?,
            values(&mine)?,
            values(&sum)?,
            values(&b)?,
            pg.bytes_sent(),
        ))
    })?;
    for (rank, (full, mine, sum, b, bytes)) in results.iter().enumerate() {
        assert_eq!(
            full,
            &[0.0, 1.0, 2.0, 10.0, 11.0, 12.0],
            "rank {rank} all-gather"
        );
        let expect = if rank == 0 { [3.0, 6.0] } else { [9.0, 12.0] };
        assert_eq!(mine.as_slice(), &expect, "rank {rank} reduce-scatter");
        assert_eq!(sum, &[3.0], "rank {rank} all-reduce");
        assert_eq!(b, &[1.0, 1.0], "rank {rank} broadcast");
        // ring cost: all-gather 3 floats + reduce-scatter 2 floats + all-reduce 1 float,
        // plus the broadcast's 2 floats on the root
        let expected = 4 * (3 + 2 + 1) + if rank == 1 { 8 } else { 0 };
        assert_eq!(*bytes, expected, "rank {rank} bytes sent");
    }
    Ok(())
}

#[test]
fn a_collective_one_rank_skips_times_out_naming_rank_unit_and_op() -> anyhow::Result<()> {
    let started = Instant::now();
    let results = on_ranks(2, Duration::from_secs(2), |pg| {
        if pg.rank() == 0 {
            let shard = Tensor::ones([4], (Kind::Float, tch::Device::Cpu));
            let mut full = Tensor::zeros([8], (Kind::Float, tch::Device::Cpu));
            let err = pg
                .all_gather_into(&mut full, &shard, "vision")?
                .wait()
                .err();
            Ok(err.map(|e| e.to_string()))
        } else {
            // alive but busy elsewhere (not dead: a dead peer fails faster, "closed by peer")
            std::thread::sleep(Duration::from_secs(4));
            Ok(None)
        }
    })?;
    let message = results[0]
        .clone()
        .ok_or_else(|| anyhow::anyhow!("rank 0 did not fail"))?;
    assert!(
        message.starts_with("rank 0: all-gather of unit 'vision' timed out after 2s"),
        "{message}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
    );
    Ok(())
}

#[test]
fn one_rank_group_works_without_peers() -> anyhow::Result<()> {
    let pg = ProcessGroup::single(Duration::from_secs(10))?;
    let shard = Tensor::from_slice(&[1.0f32, 2.0]);
    let mut full = Tensor::zeros([2], (Kind::Float, tch::Device::Cpu));
    pg.all_gather_into(&mut full, &shard, "toy")?.wait()?;
    assert_eq!(values(&full)?, vec![1.0, 2.0]);
    assert_eq!(pg.bytes_sent(), 0);
    Ok(())
}

/// Three ranks exchange uneven row counts (some zero): each receives its rows in rank order,
/// and the gradient of the received rows comes back to the rows that were sent, on the rank
/// that sent them.
#[test]
fn all_to_all_delivers_uneven_rows_and_sends_their_gradients_back() -> anyhow::Result<()> {
    // send[i][j]: rows rank i sends to rank j.
    const SEND: [[i64; 3]; 3] = [[1, 0, 2], [2, 1, 0], [0, 3, 1]];
    let results = on_ranks(3, Duration::from_secs(20), |pg| {
        let r = pg.rank();
        let send = SEND[r].to_vec();
        let recv: Vec<i64> = (0..3).map(|i| SEND[i][r]).collect();
        let rows: i64 = send.iter().sum();
        // Row k of rank r holds [100r + k, -(100r + k)].
        let base = Tensor::arange(rows, (Kind::Float, tch::Device::Cpu)) + 100.0 * r as f64;
        let input = Tensor::stack(&[&base, &(-&base)], 1).set_requires_grad(true);
        let out = pg.all_to_all(&input, &send, &recv, "layers.0 dispatch")?;
        // Each received row's gradient: its position on the receiving rank, times 1000(r+1).
        let weight = (Tensor::arange(out.size()[0], (Kind::Float, tch::Device::Cpu)) + 1.0)
            * (1000.0 * (r + 1) as f64);
        let loss = (&out * weight.unsqueeze(1)).sum(Kind::Float);
        let grad = Tensor::run_backward(&[loss], &[&input], false, false).remove(0);
        Ok((values(&out)?, values(&grad)?))
    })?;
    // Rows each rank sends to each destination, and where they land there.
    for (r, (out, _)) in results.iter().enumerate() {
        let mut want = Vec::new();
        for (i, row) in SEND.iter().enumerate() {
            let first: i64 = row[..r].iter().sum();
            for k in first..first + row[r] {
                let v = (100 * i as i64 + k) as f32;
                want.extend([v, -v]);
            }
        }
        assert_eq!(out, &want, "rank {r} received");
    }
    for (i, (_, grad)) in results.iter().enumerate() {
        let mut want = Vec::new();
        for (j, &n) in SEND[i].iter().enumerate() {
            // Where rank i's rows sit among rank j's received rows.
            let before: i64 = (0..i).map(|s| SEND[s][j]).sum();
            for k in 0..n {
                let g = ((before + k + 1) * 1000 * (j as i64 + 1)) as f32;
                want.extend([g, g]);
            }
        }
        assert_eq!(grad, &want, "rank {i} gradient");
    }
    Ok(())
}

#[test]
fn an_all_to_all_a_peer_never_joins_fails_naming_rank_and_exchange() -> anyhow::Result<()> {
    let results = on_ranks(2, Duration::from_secs(2), |pg| {
        if pg.rank() == 0 {
            let x = Tensor::ones([2, 3], (Kind::Float, tch::Device::Cpu));
            let err = pg
                .all_to_all(&x, &[1, 1], &[1, 1], "layers.1 dispatch")
                .err();
            Ok(err.map(|e| e.to_string()))
        } else {
            std::thread::sleep(Duration::from_secs(4));
            Ok(None)
        }
    })?;
    let message = results[0]
        .clone()
        .ok_or_else(|| anyhow::anyhow!("rank 0 did not fail"))?;
    assert!(
        message.starts_with("rank 0: all-to-all of unit 'layers.1 dispatch' timed out"),
        "{message}"
    );
    Ok(())
}

/// A peer that dies between the forward exchange and its backward (its group closed, as when
/// the process is killed): the survivor's backward fails with an error naming the exchange,
/// well before the timeout, instead of hanging.
#[test]
fn a_peer_gone_before_the_backward_exchange_fails_the_backward_naming_it() -> anyhow::Result<()> {
    let started = Instant::now();
    let results = on_ranks(2, Duration::from_secs(30), |pg| {
        let x = Tensor::ones([2, 3], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
        let y = pg.all_to_all(&x, &[1, 1], &[1, 1], "layers.0 experts")?;
        if pg.rank() == 1 {
            drop(pg);
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(300));
        let loss = y.sum(Kind::Float);
        let err = Tensor::f_run_backward(&[loss], &[&x], false, false).err();
        Ok(Some(err.map(|e| e.to_string())))
    })?;
    let message = results[0]
        .clone()
        .flatten()
        .ok_or_else(|| anyhow::anyhow!("rank 0's backward did not fail"))?;
    assert!(
        message.contains("all-to-all") || message.contains("closed"),
        "{message}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "took {:?}: it waited for the timeout",
        started.elapsed()
    );
    Ok(())
}
