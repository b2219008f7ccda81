// The harness shared by the `pmhash serve` tests (included by each):
// the server process, the Redis tools, and a raw RESP client.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// How long to wait for anything (startup, shutdown, a reply, a client).
const DEADLINE: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------
// Temp dirs and the server process
// ---------------------------------------------------------------------------

/// A unique directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "pmhash-serve-{}-{}-{name}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        TempDir(p)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running `pmhash serve`; killed (SIGKILL) on drop.
struct Server {
    child: Child,
    port: u16,
    /// The rest of the child's stdout, line by line.
    lines: Receiver<String>,
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().unwrap().port()
}

impl Server {
    /// Starts `pmhash serve --dir DIR --addr 127.0.0.1:PORT EXTRA...` on a
    /// free port and waits for its "listening" line.
    fn start(dir: &Path, extra: &[&str]) -> Server {
        Server::start_wrapped(dir, extra, None)
    }

    /// As [`start`](Self::start), with `shell` run first in a shell that
    /// then execs the server (e.g. `ulimit -n 256`; the server keeps the
    /// pid), and the server's stderr appended to `log` if given.
    fn start_wrapped(dir: &Path, extra: &[&str], wrap: Option<(&str, &Path)>) -> Server {
        // Another process may take the port between our probe and the
        // server's bind: then the server exits early and we try again.
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port();
            let mut cmd = match wrap {
                None => Command::new(env!("CARGO_BIN_EXE_pmhash")),
                Some((shell, log)) => {
                    let mut c = Command::new("sh");
                    c.arg("-c")
                        .arg(format!("{shell} && exec \"$@\" 2>>\"$PMHASH_TEST_LOG\""))
                        .arg("sh")
                        .arg(env!("CARGO_BIN_EXE_pmhash"))
                        .env("PMHASH_TEST_LOG", log);
                    c
                }
            };
            let mut child = cmd
                .arg("serve")
                .arg("--dir")
                .arg(dir)
                .arg("--addr")
                .arg(format!("127.0.0.1:{port}"))
                .args(extra)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("spawn pmhash serve");
            let stdout = child.stdout.take().unwrap();
            let (tx, lines) = mpsc::channel();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
            let want = format!("pmhash serve: listening on 127.0.0.1:{port}");
            let until = Instant::now() + DEADLINE;
            loop {
                let left = until.saturating_duration_since(Instant::now());
                match lines.recv_timeout(left) {
                    Ok(line) if line == want => {
                        return Server { child, port, lines };
                    }
                    Ok(line) => last = format!("unexpected stdout line {line:?}"),
                    Err(RecvTimeoutError::Timeout) => {
                        let _ = child.kill();
                        let _ = child.wait();
                        panic!("pmhash serve did not print {want:?} within {DEADLINE:?} ({last})");
                    }
                    Err(RecvTimeoutError::Disconnected) => {
                        // Exited before listening (port taken?): retry.
                        let st = child.wait().expect("wait");
                        last = format!("pmhash serve exited before listening: {st}");
                        break;
                    }
                }
            }
        }
        panic!("could not start pmhash serve: {last}");
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The server's resident memory in bytes (`VmRSS`).
    fn rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("read the server's /proc status");
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .expect("VmRSS in /proc status");
        kb * 1024
    }

    /// SIGKILL, as a crash would.
    fn kill9(mut self) {
        self.child.kill().expect("SIGKILL the server");
        self.child.wait().expect("reap the server");
    }

    /// Waits (with the deadline) for the process to exit by itself;
    /// returns its status and the stdout lines it printed after
    /// "listening".
    fn wait_exit(mut self) -> (ExitStatus, Vec<String>) {
        let until = Instant::now() + DEADLINE;
        let status = loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                break st;
            }
            assert!(
                Instant::now() < until,
                "pmhash serve did not exit within {DEADLINE:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        let mut out = Vec::new();
        while let Ok(l) = self.lines.recv_timeout(DEADLINE) {
            out.push(l);
        }
        (status, out)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------
// redis-cli / redis-benchmark
// ---------------------------------------------------------------------------

/// Runs a Redis tool under `timeout` so a hung client fails the test
/// instead of hanging it.
fn tool(prog: &str, args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut cmd = Command::new("timeout");
    cmd.arg(DEADLINE.as_secs().to_string())
        .arg(prog)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {prog}: {e}"));
    if let Some(data) = stdin {
        let mut w = child.stdin.take().unwrap();
        let data = data.to_vec();
        std::thread::spawn(move || {
            let _ = w.write_all(&data);
        });
    }
    let out = child.wait_with_output().expect("wait for the tool");
    assert_ne!(
        out.status.code(),
        Some(124),
        "{prog} {args:?} timed out after {DEADLINE:?}"
    );
    out
}

/// `redis-cli -p PORT --no-raw ARGS...`: its stdout (the exit status must
/// be 0; redis-cli exits 0 on error replies too).
fn cli(port: u16, args: &[&str]) -> String {
    let p = port.to_string();
    let mut all = vec!["-p", &p, "--no-raw"];
    all.extend_from_slice(args);
    let out = tool("redis-cli", &all, None);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "redis-cli {all:?} failed ({}): stdout {stdout:?} stderr {:?}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn info_field(port: u16, args: &[&str], field: &str) -> String {
    let mut a = args.to_vec();
    a.push("info");
    let info = cli(port, &a);
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("INFO has no {field}: {info}"))
        .trim_end()
        .to_string()
}

// ---------------------------------------------------------------------------
// A raw RESP client
// ---------------------------------------------------------------------------

#[derive(Debug, PartialEq)]
enum V {
    Simple(String),
    Err(String),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    Array(Vec<V>),
    Map(Vec<(V, V)>),
}

struct Conn {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

fn bad(m: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, m)
}

impl Conn {
    fn connect(port: u16) -> Conn {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("connect to pmhash serve");
        s.set_read_timeout(Some(DEADLINE)).unwrap();
        s.set_write_timeout(Some(DEADLINE)).unwrap();
        s.set_nodelay(true).unwrap();
        Conn {
            r: BufReader::new(s.try_clone().unwrap()),
            w: s,
        }
    }

    fn encode(buf: &mut Vec<u8>, args: &[&[u8]]) {
        buf.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for a in args {
            buf.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            buf.extend_from_slice(a);
            buf.extend_from_slice(b"\r\n");
        }
    }

    fn send(&mut self, args: &[&[u8]]) -> io::Result<()> {
        let mut buf = Vec::new();
        Self::encode(&mut buf, args);
        self.w.write_all(&buf)
    }

    fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.w.write_all(bytes)
    }

    /// One line without its CRLF; EOF is an error.
    fn line(&mut self) -> io::Result<String> {
        let mut l = Vec::new();
        if self.r.read_until(b'\n', &mut l)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        if !l.ends_with(b"\r\n") {
            return Err(bad(format!("reply line not ended by CRLF: {l:?}")));
        }
        l.truncate(l.len() - 2);
        String::from_utf8(l).map_err(|e| bad(e.to_string()))
    }

    /// The next reply line exactly as sent (with its CRLF).
    fn raw_line(&mut self) -> io::Result<String> {
        Ok(self.line()? + "\r\n")
    }

    fn read(&mut self) -> io::Result<V> {
        let l = self.line()?;
        let (t, rest) = l.split_at(1.min(l.len()));
        let num = |s: &str| {
            s.parse::<i64>()
                .map_err(|_| bad(format!("bad number {l:?}")))
        };
        Ok(match t {
            "+" => V::Simple(rest.into()),
            "-" => V::Err(rest.into()),
            ":" => V::Int(num(rest)?),
            "_" => V::Nil,
            "$" => match num(rest)? {
                n if n < 0 => V::Nil,
                n => {
                    let mut b = vec![0; n as usize + 2];
                    self.r.read_exact(&mut b)?;
                    if !b.ends_with(b"\r\n") {
                        return Err(bad("bulk not ended by CRLF".into()));
                    }
                    b.truncate(n as usize);
                    V::Bulk(b)
                }
            },
            "*" => match num(rest)? {
                n if n < 0 => V::Nil,
                n => V::Array((0..n).map(|_| self.read()).collect::<io::Result<_>>()?),
            },
            "%" => V::Map(
                (0..num(rest)?)
                    .map(|_| Ok((self.read()?, self.read()?)))
                    .collect::<io::Result<_>>()?,
            ),
            _ => return Err(bad(format!("unexpected reply line {l:?}"))),
        })
    }

    fn cmd(&mut self, args: &[&[u8]]) -> V {
        self.send(args).expect("send a command");
        self.read().expect("read a reply")
    }
}

fn bulk(s: &str) -> V {
    V::Bulk(s.as_bytes().to_vec())
}
