//! The fake API server as a process of its own, for a benchmark that must
//! not share the operator's process: serves until killed, and writes a
//! kubeconfig pointing at itself once it listens.

use std::net::SocketAddr;
use std::path::PathBuf;

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
}

#[actix_rt::main]
async fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let fake = FakeApiServer::start_on(args.listen, args.cluster)?;
    if let Some(rate) = args.max_requests_per_second {
        fake.limit_rate(rate, args.burst);
    }
    // A reader polling for the file never sees half of it.
    let partial = args.kubeconfig_out.with_extension("partial");
    std::fs::write(&partial, fake.kubeconfig(&args.namespace))?;
    std::fs::rename(&partial, &args.kubeconfig_out)?;
    println!("fake-apiserver serving on {}", fake.url());
    std::future::pending::<()>().await;
    Ok(())
}
