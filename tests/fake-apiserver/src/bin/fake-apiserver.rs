//! The fake API server as a process of its own, for a benchmark that must
//! not share the operator's process: serves until killed, and writes a
//! kubeconfig pointing at itself once it listens (with `--links N`, first
//! one per link, so each client's requests can be told apart).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::Parser;
use fake_apiserver::FakeApiServer;

#[derive(Parser)]
#[command(about = "An in-memory Kubernetes API server for tests and benchmarks")]
struct Args {
    /// Address to serve on (port 0 picks a free one; the kubeconfig names it).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// A whole cluster's rules: initial namespaces, objects only in
    /// namespaces that exist, custom kinds only while their CRD exists.
    #[arg(long)]
    cluster: bool,
    /// Answer 429 with Retry-After past this many requests a second (per
    /// priority level: Leases have their own budget; watches are exempt).
    #[arg(long)]
    max_requests_per_second: Option<f64>,
    /// Requests allowed at once above the rate (with --max-requests-per-second).
    #[arg(long, default_value_t = 1, requires = "max_requests_per_second")]
    burst: u32,
    /// Where to write the kubeconfig (written whole, by a rename, once serving).
    #[arg(long)]
    kubeconfig_out: PathBuf,
    /// The kubeconfig context's namespace.
    #[arg(long, default_value = "default")]
    namespace: String,
    /// Also serve on N more addresses (free ports on the --listen IP), each
    /// counting its own requests (`link` in `GET /debug/requests` asked
    /// there), and write their kubeconfigs to `<kubeconfig-out>.link-<i>`,
    /// i from 0, before the main one.
    #[arg(long, default_value_t = 0)]
    links: usize,
}

/// Writes `text` to `path` whole, by a rename: a reader polling for the
/// file never sees half of it.
fn write_whole(path: &Path, text: &str) -> std::io::Result<()> {
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    std::fs::write(&partial, text)?;
    std::fs::rename(&partial, path)
}

/// Where link `i`'s kubeconfig goes: `<kubeconfig-out>.link-<i>`.
fn link_kubeconfig(main: &Path, i: usize) -> PathBuf {
    let mut path = main.as_os_str().to_owned();
    path.push(format!(".link-{i}"));
    PathBuf::from(path)
}

#[actix_rt::main]
async fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let fake = FakeApiServer::start_on(args.listen, args.cluster)?;
    if let Some(rate) = args.max_requests_per_second {
        fake.limit_rate(rate, args.burst);
    }
    // Kept for the process's life: each link serves while its value lives.
    let mut links = Vec::with_capacity(args.links);
    for i in 0..args.links {
        let link = fake.link()?;
        write_whole(
            &link_kubeconfig(&args.kubeconfig_out, i),
            &link.kubeconfig(&args.namespace),
        )?;
        println!("fake-apiserver link {i} serving on {}", link.url());
        links.push(link);
    }
    // Last: a reader waiting for it finds every link's kubeconfig written.
    write_whole(&args.kubeconfig_out, &fake.kubeconfig(&args.namespace))?;
    println!("fake-apiserver serving on {}", fake.url());
    std::future::pending::<()>().await;
    Ok(())
}
