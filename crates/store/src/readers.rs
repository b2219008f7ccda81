//! The reader threads of localized reads (§3.6 of the spec): per node, a
//! queue of value-read jobs and the threads pinned to that node that
//! serve it. Range scans ([`crate::scan`]) hand them work.

use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// A batch of value reads for one node.
pub(crate) struct Job {
    /// Pool offsets of the entries, in the caller's order.
    pub(crate) offs: Vec<(usize, u64)>,
    pub(crate) pool: Arc<pmem::Pool>,
    pub(crate) reply: Sender<Vec<(usize, Vec<u8>)>>,
}

/// Reader threads per node.
pub(crate) struct Readers {
    pub(crate) queues: Vec<Mutex<Sender<Job>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// Reads per job handed to a reader thread (the paper's repository uses 15).
pub(crate) const BATCH: usize = 16;

impl Readers {
    pub(crate) fn new(nodes: u32, per_node: usize) -> Readers {
        let mut queues = Vec::new();
        let mut threads = Vec::new();
        for node in 0..nodes {
            let (tx, rx) = channel::<Job>();
            let rx = Arc::new(Mutex::new(rx));
            for _ in 0..per_node {
                let rx = rx.clone();
                let numa = crate::numa::Numa::new(nodes, None, 0);
                threads.push(
                    std::thread::Builder::new()
                        .name(format!("pmhash-scan-n{node}"))
                        .spawn(move || {
                            numa.pin_thread(node);
                            loop {
                                let job = match rx.lock().expect("reader queue").recv() {
                                    Ok(j) => j,
                                    Err(_) => return,
                                };
                                let mut out = Vec::with_capacity(job.offs.len());
                                for (i, off) in job.offs {
                                    out.push((i, read_value(&job.pool, off)));
                                }
                                let _ = job.reply.send(out);
                            }
                        })
                        .expect("spawn scan reader"),
                );
            }
            queues.push(Mutex::new(tx));
        }
        Readers {
            queues,
            threads: Mutex::new(threads),
        }
    }
}

impl Drop for Readers {
    fn drop(&mut self) {
        self.queues.clear();
        for t in self.threads.lock().expect("readers").drain(..) {
            let _ = t.join();
        }
    }
}

pub(crate) fn read_value(pool: &pmem::Pool, off: u64) -> Vec<u8> {
    let lens = pool.load_u64(off + 8);
    let Some((klen, vlen)) = crate::layout::parse_lens(lens) else {
        return Vec::new();
    };
    let mut v = vec![0u8; vlen];
    pool.read(off + crate::layout::ENTRY_HEADER + klen as u64, &mut v);
    v
}
