//! `hixl peers --directory URL`: the live engines of a directory.

use hixl::directory::Directory;
use hixl::Options;

use crate::util::{parse_kv, CliResult};

/// Arguments of `hixl peers`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The etcd directory, `etcd://host:port[,host:port...]`.
    #[arg(long, value_name = "URL")]
    pub directory: String,
    /// A directory option `KEY=VALUE` (`hixl.DirectoryPrefix`, `hixl.DirectoryUser`,
    /// `hixl.DirectoryPassword`); repeatable.
    #[arg(long = "option", value_parser = parse_kv)]
    pub options: Vec<(String, String)>,
    /// One JSON object per engine instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Lists the directory's live engines (and names the entries it cannot read).
pub async fn run(a: Args) -> CliResult {
    let mut o = Options::default();
    o.set("hixl.Directory", &a.directory)?;
    for (k, v) in &a.options {
        if !k.starts_with("hixl.Directory") {
            return Err(hixl_cli::fail!(
                "--option {k}: only hixl.Directory* keys apply to `hixl peers`"
            ));
        }
        o.set(k, v)?;
    }
    let d = Directory::open(&o.directory).await?;
    let entries = d.entries();
    if a.json {
        for e in &entries {
            println!("{}", String::from_utf8_lossy(&e.encode()));
        }
    } else {
        println!("{} engine(s) in {}", entries.len(), d.describe());
        if !entries.is_empty() {
            println!(
                "{:<24} {:<16} {:<24} {:<18} table",
                "NAME", "INCARNATION", "ADDRESS", "TRANSPORTS"
            );
        }
        for e in &entries {
            println!(
                "{:<24} {:<16} {:<24} {:<18} {}",
                e.name,
                e.incarnation,
                e.addrs.join(","),
                e.transports.join(","),
                e.table_digest
            );
        }
    }
    for (name, why) in d.unreadable() {
        eprintln!("hixl: skipped {name:?}: {why}");
    }
    Ok(())
}
