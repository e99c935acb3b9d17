//! The epoch's sample order: one seeded shuffle of all samples, then split into a text stream
//! and an image stream. Both depend only on (fingerprint, seed, epoch), never on the world
//! size, so a position (samples consumed per stream) means the same thing for any W.
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use sha2::{Digest, Sha256};
use tessera_shards::Kind;

#[derive(Clone, Debug)]
pub(crate) struct SampleOrder {
    /// Sample indices in shuffled order.
    pub order: Vec<u32>,
    /// Per kind (`Kind as usize`): the positions in `order` holding that kind, ascending.
    pub streams: [Vec<u32>; 2],
    /// Short hash naming this order (stored in resume positions).
    pub key: String,
}

impl SampleOrder {
    pub(crate) fn new(kinds: &[Kind], fingerprint: &str, seed: u64, epoch: u64) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(b"tessera-plan-order-v1\0");
        hasher.update(fingerprint.as_bytes());
        hasher.update([0u8]);
        hasher.update(seed.to_le_bytes());
        hasher.update(epoch.to_le_bytes());
        hasher.update((kinds.len() as u64).to_le_bytes());
        let digest: [u8; 32] = hasher.finalize().into();
        let mut rng = ChaCha20Rng::from_seed(digest);
        let mut order: Vec<u32> = (0..kinds.len() as u32).collect();
        order.shuffle(&mut rng);
        let mut streams = [Vec::new(), Vec::new()];
        for (pos, &sample) in order.iter().enumerate() {
            streams[kinds[sample as usize] as usize].push(pos as u32);
        }
        SampleOrder {
            order,
            streams,
            key: hex::encode(&digest[..8]),
        }
    }

    /// An order given whole (a mixture's draw): `kinds` are the items' kinds, planned in
    /// their index order; `key` names the order.
    pub(crate) fn given(kinds: &[Kind], key: &str) -> Self {
        let order: Vec<u32> = (0..kinds.len() as u32).collect();
        let mut streams = [Vec::new(), Vec::new()];
        for (pos, &item) in order.iter().enumerate() {
            streams[kinds[item as usize] as usize].push(pos as u32);
        }
        SampleOrder {
            order,
            streams,
            key: key.to_string(),
        }
    }

    /// Drops every sample of another kind. The kept samples stay in the whole dataset's
    /// shuffled order, so the filter does not change which of them comes first. The key names
    /// the filter too: a position counted in the unfiltered order means something else here.
    pub(crate) fn keep_only(&mut self, keep: Kind, kinds: &[Kind]) {
        self.key = format!("{}-only-{keep:?}", self.key).to_lowercase();
        self.order.retain(|&s| kinds[s as usize] == keep);
        self.streams = [Vec::new(), Vec::new()];
        self.streams[keep as usize] = (0..self.order.len() as u32).collect();
    }

    /// Drops every item longer than `limit` tokens (`lens` per item), keeping the others in
    /// their order. The key names the limit: a position counted in the unfiltered order
    /// means something else here.
    pub(crate) fn drop_longer_than(&mut self, limit: u32, lens: &[u32]) {
        self.key = format!("{}-within-{limit}", self.key);
        let kind_of: Vec<Option<usize>> = {
            let mut k = vec![None; self.order.len()];
            for (kind, stream) in self.streams.iter().enumerate() {
                for &pos in stream {
                    k[pos as usize] = Some(kind);
                }
            }
            k
        };
        let mut order = Vec::with_capacity(self.order.len());
        let mut streams = [Vec::new(), Vec::new()];
        for (pos, &item) in self.order.iter().enumerate() {
            let Some(kind) = kind_of[pos] else { continue };
            if lens[item as usize] <= limit {
                streams[kind].push(order.len() as u32);
                order.push(item);
            }
        }
        self.order = order;
        self.streams = streams;
    }

    pub(crate) fn stream_len(&self, kind: Kind) -> usize {
        self.streams[kind as usize].len()
    }

    /// The `i`-th sample of `kind`'s stream.
    pub(crate) fn sample(&self, kind: Kind, i: usize) -> u32 {
        self.order[self.streams[kind as usize][i] as usize]
    }

    /// Position in the global shuffled order of `kind`'s `i`-th sample.
    pub(crate) fn global_pos(&self, kind: Kind, i: usize) -> Option<u32> {
        self.streams[kind as usize].get(i).copied()
    }
}
