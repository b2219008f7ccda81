//! A small key-value program over `pmhash::Store`: put, get, delete and
//! scan from the command line, in a store directory that persists between
//! runs.
//!
//! ```sh
//! cargo run --release --example kv -- /tmp/kv put apple red
//! cargo run --release --example kv -- /tmp/kv get apple
//! cargo run --release --example kv -- /tmp/kv scan a z
//! cargo run --release --example kv -- /tmp/kv delete apple
//! ```

use std::process::ExitCode;

use pmhash::Store;

fn run(args: &[String]) -> Result<String, String> {
    let usage = "usage: kv DIR put KEY VALUE | get KEY | delete KEY | scan START [END] | len";
    let (dir, cmd) = match args {
        [dir, cmd, ..] => (dir, cmd.as_str()),
        _ => return Err(usage.into()),
    };
    let store = Store::open(dir).map_err(|e| format!("cannot open {dir}: {e}"))?;
    let out = match (cmd, &args[2..]) {
        ("put", [k, v]) => {
            store
                .put(k.as_bytes(), v.as_bytes())
                .map_err(|e| e.to_string())?;
            "OK".to_string()
        }
        ("get", [k]) => match store.get(k.as_bytes()).map_err(|e| e.to_string())? {
            Some(v) => String::from_utf8_lossy(&v).into_owned(),
            None => "(absent)".to_string(),
        },
        ("delete", [k]) => match store.delete(k.as_bytes()).map_err(|e| e.to_string())? {
            true => "deleted".to_string(),
            false => "(absent)".to_string(),
        },
        ("scan", [start, rest @ ..]) if rest.len() <= 1 => {
            let end = rest.first().map(|e| e.as_bytes());
            let pairs = store
                .scan(start.as_bytes(), end, 1000)
                .map_err(|e| e.to_string())?;
            pairs
                .iter()
                .map(|(k, v)| {
                    format!(
                        "{} = {}",
                        String::from_utf8_lossy(k),
                        String::from_utf8_lossy(v)
                    )
                })
                .collect::<Vec<_>>()
                .join("\n")
        }
        ("len", []) => store.len().to_string(),
        _ => return Err(usage.into()),
    };
    store.close().map_err(|e| e.to_string())?;
    Ok(out)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(out) => {
            if !out.is_empty() {
                println!("{out}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kv: {e}");
            ExitCode::FAILURE
        }
    }
}
