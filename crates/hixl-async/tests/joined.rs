//! `Engine::shutdown` joins every task the engines started: their links' (the AutoConnect
//! watcher and a fabric revocation among them) and their own (the reactor, the accept
//! loops, each accepted connection's session). On a current-thread runtime, so that no task
//! runs between `shutdown` returning and the count of live tasks: what it counts then is what
//! shutdown left running.

use std::time::Duration;

use hixl_async::{Engine, HostBuffer};
use hixl_core::{Access, OpDesc};

const T: Duration = Duration::from_secs(10);

fn alive() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

#[tokio::test(flavor = "current_thread")]
async fn shutdown_leaves_no_task_of_either_engine_running() {
    let before = alive();
    let target = Engine::builder("127.0.0.1")
        .ephemeral_port()
        .build()
        .await
        .expect("target");
    let pooled = target
        .register_pooled(1 << 20, Access::REMOTE_RW, Some("pool"))
        .expect("pooled");
    let heap = target
        .register_with(
            HostBuffer::zeroed(1 << 20).expect("buffer"),
            Access::REMOTE_RW,
            Some("heap"),
        )
        .expect("heap");
    // One initiator over tcp with AutoConnect (its links get a watcher), one over the fabric.
    let mut inits = Vec::new();
    for (transport, auto) in [("tcp", "1"), ("fabric", "0")] {
        let e = Engine::builder("127.0.0.1")
            .option("hixl.Transport", transport)
            .option("AutoConnect", auto)
            .build()
            .await
            .expect("initiator");
        let local = e
            .register(HostBuffer::zeroed(1 << 20).expect("buffer"))
            .expect("local");
        let p = e.connect(target.local_engine(), T).await.expect("connect");
        for name in ["pool", "heap"] {
            let r = p.region(name).expect("region");
            p.write(&[OpDesc::new(local.addr(), r.addr, 64 << 10)])
                .await
                .expect("write");
        }
        inits.push((e, p, local));
    }
    // A revocation: the fabric initiator's channel acks it from a task of its link.
    target.deregister(&heap).await.expect("deregister");
    assert!(alive() > before, "the engines run tasks");
    for (e, p, _) in &inits {
        drop(p.clone());
        e.shutdown(T).await;
    }
    target.shutdown(T).await;
    let left = alive();
    drop(pooled);
    assert_eq!(
        left, before,
        "tasks still running once every engine has shut down"
    );
}
