//! The target process, seen from the initiator: started as `hixl soak-serve`, its output
//! lines routed to the controllers of the lanes.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use hixl_cli::child::Target;
use tokio::sync::mpsc;

use super::args::Plan;
use crate::util::CliResult;

/// A running target, and where its lines go.
pub(super) struct Launched {
    /// The target process.
    pub(super) target: Target,
    /// The lines of each lane's transport, in the order of the plan's names.
    pub(super) receivers: Vec<mpsc::UnboundedReceiver<String>>,
    /// Set when the target's output ends (it exited).
    pub(super) gone: Arc<AtomicBool>,
}

/// Starts the target with room for the plan's regions, and a thread that routes its lines.
pub(super) fn launch(plan: &Plan) -> CliResult<Launched> {
    let (slot_len, per_region) = (plan.slot_len, plan.per_region);
    let exe: PathBuf = std::env::current_exe()?;
    let mut target = Target::spawn_with(
        &exe,
        &[
            "soak-serve",
            "--mem",
            &per_region.to_string(),
            "--max-check",
            &slot_len.to_string(),
        ],
    )?;

    // Target lines "SOAK tag=<transport> ..." go to that transport's controller.
    let gone = Arc::new(AtomicBool::new(false));
    let mut routes = HashMap::new();
    let mut receivers = Vec::new();
    for n in plan.names {
        let (tx, rx) = mpsc::unbounded_channel::<String>();
        routes.insert(n.to_string(), tx);
        receivers.push(rx);
    }
    {
        let lines = target.take_lines();
        let gone = gone.clone();
        std::thread::spawn(move || {
            for l in lines.iter() {
                let tag = l
                    .strip_prefix("SOAK tag=")
                    .and_then(|r| r.split_whitespace().next())
                    .unwrap_or("");
                match routes.get(tag) {
                    Some(tx) => {
                        let _ = tx.send(l);
                    }
                    None if l.starts_with("SOAK ") => eprintln!("hixl soak: target: {l}"),
                    None => {}
                }
            }
            gone.store(true, Ordering::SeqCst);
        });
    }
    Ok(Launched {
        target,
        receivers,
        gone,
    })
}
