//! `pmhash-fuzz TARGET [--seconds N] [--seed S] [--case I] [--replay PATH]...
//! [--out DIR] [--case-timeout SECS] [--keep-going]`: runs a fuzz target
//! (see `docs/fuzzing.md`). Exits 0 when every case passed, 1 on a
//! failure (each failing input is printed and saved under `--out`), 2 on
//! bad arguments.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use pmhash_fuzz::{run, Options};

#[global_allocator]
static ALLOC: pmhash_fuzz::CountingAlloc = pmhash_fuzz::CountingAlloc;

const USAGE: &str = "usage: pmhash-fuzz TARGET [--seconds N] [--seed S] [--case I] \
[--replay FILE_OR_DIR]... [--out DIR] [--case-timeout SECS] [--keep-going]\n\
targets: resp, glob, commands, pools";

fn parse(args: &[String]) -> Result<(Options, bool), String> {
    let mut it = args.iter();
    let target = it.next().ok_or("no target")?.clone();
    pmhash_fuzz::target(&target)?;
    let mut o = Options {
        target,
        seconds: 10.0,
        seed: 1,
        case: None,
        replay: Vec::new(),
        out: PathBuf::from("target/fuzz-out"),
        case_timeout: Duration::from_secs(20),
        keep_going: false,
        skip: 0,
    };
    let mut worker = false;
    while let Some(a) = it.next() {
        let mut val = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))
        };
        let num = |name: &str, v: String| -> Result<f64, String> {
            v.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| format!("{name}: {v:?} is not a number of at least 0"))
        };
        match a.as_str() {
            "--seconds" => o.seconds = num(a, val(a)?)?,
            "--seed" => {
                let v = val(a)?;
                o.seed = v
                    .parse()
                    .map_err(|_| format!("--seed: {v:?} is not an integer"))?;
            }
            "--case" => {
                let v = val(a)?;
                o.case = Some(
                    v.parse()
                        .map_err(|_| format!("--case: {v:?} is not an integer"))?,
                );
            }
            "--replay" => o.replay.push(PathBuf::from(val(a)?)),
            "--out" => o.out = PathBuf::from(val(a)?),
            "--case-timeout" => {
                let s = num(a, val(a)?)?;
                if s == 0.0 || s > 86_400.0 {
                    return Err("--case-timeout: must be in (0, 86400] seconds".into());
                }
                o.case_timeout = Duration::from_secs_f64(s);
            }
            "--keep-going" => o.keep_going = true,
            "--skip" => {
                let v = val(a)?;
                o.skip = v
                    .parse()
                    .map_err(|_| format!("--skip: {v:?} is not an integer"))?;
            }
            "--worker" => worker = true,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok((o, worker))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() || args[0] == "--help" || args[0] == "help" {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let (o, worker) = match parse(&args) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("pmhash-fuzz: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if worker {
        return match pmhash_fuzz::worker(&o) {
            Ok(0) => ExitCode::SUCCESS,
            Ok(_) => ExitCode::from(1),
            Err(e) => {
                eprintln!("pmhash-fuzz: {e}");
                ExitCode::from(2)
            }
        };
    }
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("pmhash-fuzz: cannot find this program's path: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&o, &exe, &args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("pmhash-fuzz: {e}");
            ExitCode::from(2)
        }
    }
}
