//! Range scans through the ordered index, with optional *localized reads*
//! (§3.6 of the spec): the scanning thread collects `(key, v_addr)` pairs,
//! hands the value reads to reader threads of the node that holds each
//! entry, waits for them, and returns the pairs in key order.

use std::sync::mpsc::{channel, Sender};

use engine::Result;

use crate::inner::Inner;
use crate::layout::{vaddr_node, vaddr_off};
use crate::readers::{read_value, Job, Readers, BATCH};

pub(crate) fn scan(
    s: &Inner,
    start: &[u8],
    end: Option<&[u8]>,
    limit: usize,
) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    // The pin covers the reader threads' reads too: we wait for them.
    let _p = s.epochs.pin();
    let mut pairs = Vec::new();
    s.index.range(start, end, limit, &mut pairs)?;
    let here = s.numa.current();
    let mut out: Vec<(Vec<u8>, Vec<u8>)> = pairs
        .iter()
        .map(|(k, _)| (k.as_bytes().to_vec(), Vec::new()))
        .collect();
    for (_, va) in &pairs {
        s.numa.count_read(vaddr_node(*va), here);
    }
    match &s.readers {
        Some(r) if pairs.len() > BATCH => {
            let (tx, rx) = channel();
            let mut jobs = 0;
            let mut per_node: Vec<Vec<(usize, u64)>> = vec![Vec::new(); r.queues.len()];
            for (i, (_, va)) in pairs.iter().enumerate() {
                let n = vaddr_node(*va) as usize % r.queues.len();
                per_node[n].push((i, vaddr_off(*va)));
                if per_node[n].len() == BATCH {
                    let offs = std::mem::take(&mut per_node[n]);
                    jobs += send(r, n, offs, s, &tx, &mut out);
                }
            }
            for (n, offs) in per_node.into_iter().enumerate() {
                if !offs.is_empty() {
                    jobs += send(r, n, offs, s, &tx, &mut out);
                }
            }
            for _ in 0..jobs {
                let got = rx
                    .recv()
                    .map_err(|_| engine::Error::Corrupt("a scan reader thread stopped".into()))?;
                for (i, v) in got {
                    out[i].1 = v;
                }
            }
        }
        _ => {
            for (i, (_, va)) in pairs.iter().enumerate() {
                out[i].1 = read_value(&s.pool, vaddr_off(*va));
            }
        }
    }
    if s.opts.open.verify_checksums {
        // As a get does: a value whose entry fails its checksum is an
        // error, never wrong bytes.
        for (i, (k, va)) in pairs.iter().enumerate() {
            let key = k.as_bytes();
            let Some(e) = s.log.header(vaddr_off(*va)) else {
                continue;
            };
            match s.log.file_at(e.off) {
                Some(f) => s.verify(key, &e, &out[i].1, Some(&f))?,
                // GC moved the key while it was read (the pin kept the old
                // bytes mapped): read it again where the index now names.
                None => {
                    let hash = crate::layout::key_hash(key);
                    if let Some(now) = s.index.lookup(key, hash)? {
                        let mut v = Vec::new();
                        if s.read_entry(key, hash, now, false, here, &mut v)? {
                            out[i].1 = v;
                        }
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Up to `limit` keys with `start <= key < end`, in key order, without
/// their values.
pub(crate) fn keys(
    s: &Inner,
    start: &[u8],
    end: Option<&[u8]>,
    limit: usize,
) -> Result<Vec<Vec<u8>>> {
    let _p = s.epochs.pin();
    let mut pairs = Vec::new();
    s.index.range(start, end, limit, &mut pairs)?;
    Ok(pairs.iter().map(|(k, _)| k.as_bytes().to_vec()).collect())
}

fn send(
    r: &Readers,
    n: usize,
    offs: Vec<(usize, u64)>,
    s: &Inner,
    tx: &Sender<Vec<(usize, Vec<u8>)>>,
    out: &mut [(Vec<u8>, Vec<u8>)],
) -> usize {
    let job = Job {
        offs,
        pool: s.pool.clone(),
        reply: tx.clone(),
    };
    match r.queues[n].lock().expect("reader queue").send(job) {
        Ok(()) => 1,
        // No reader left on that node: read here rather than wait forever.
        Err(e) => {
            for (i, off) in e.0.offs {
                out[i].1 = read_value(&s.pool, off);
            }
            0
        }
    }
}
