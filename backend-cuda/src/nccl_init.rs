//! NCCL calls that never block the host: the communicator is made with `blocking = 0`, so
//! ncclCommInitRankConfig (and a collective that must first connect to its peers) returns
//! ncclInProgress at once and the work goes on in NCCL's threads. Polling
//! ncclCommGetAsyncError against the collective timeout turns a rank that never shows up into
//! an error naming the ranks waited for, where the blocking ncclCommInitRank waited forever.

use std::time::Duration;

use cudarc::nccl::{result, sys};

use crate::in_flight::timed_out_waiting;
use crate::wait::{Deadline, poll_with_deadline};

/// NCCL_CONFIG_INITIALIZER (every field "undefined", so NCCL picks its defaults) with
/// `blocking = 0`. NCCL copies only the first `size` bytes, so a library older or newer than
/// these bindings reads the fields both know.
pub(crate) fn non_blocking_config() -> sys::ncclConfig_t {
    const UNDEF: i32 = i32::MIN;
    sys::ncclConfig_t {
        size: std::mem::size_of::<sys::ncclConfig_t>(),
        magic: 0xcafe_beef,
        // NCCL_VERSION(2, 30, 0), the bindings' version: the fields up to there are read.
        version: 23000,
        blocking: 0,
        cgaClusterSize: UNDEF,
        minCTAs: UNDEF,
        maxCTAs: UNDEF,
        netName: std::ptr::null(),
        splitShare: UNDEF,
        trafficClass: UNDEF,
        commName: std::ptr::null(),
        collnetEnable: UNDEF,
        CTAPolicy: UNDEF,
        shrinkShare: UNDEF,
        nvlsCTAs: UNDEF,
        nChannelsPerNetPeer: UNDEF,
        nvlinkCentricSched: UNDEF,
        graphUsageMode: UNDEF,
        numRmaCtx: UNDEF,
        maxP2pPeers: UNDEF,
    }
}

/// Why an NCCL call did not complete.
#[derive(Debug)]
pub(crate) enum Unsettled {
    /// The call itself returned this error.
    Failed(&'static str, sys::ncclResult_t),
    /// NCCL reported this error while the call went on.
    Reported(sys::ncclResult_t),
    /// Still in progress at the deadline; the text names the ranks waited for.
    TimedOut(String),
}

impl Unsettled {
    pub(crate) fn describe(&self) -> String {
        match self {
            Unsettled::Failed(call, code) => format!("{call} failed: {code:?}"),
            Unsettled::Reported(code) => {
                format!("NCCL reported {code:?} (a peer failed, or the network or a setting is wrong)")
            }
            Unsettled::TimedOut(why) => why.clone(),
        }
    }
}

/// Joins rank `rank` of `world` to the communicator of `id` on the calling thread's current
/// device, waiting at most `timeout` for the other ranks. On a timeout the half-made
/// communicator is returned with the error, for the caller to abort.
pub(crate) fn init_rank(
    rank: usize,
    world: usize,
    id: sys::ncclUniqueId,
    timeout: Duration,
) -> Result<sys::ncclComm_t, (Unsettled, Option<sys::ncclComm_t>)> {
    let deadline = Deadline::after(timeout);
    let mut config = non_blocking_config();
    let mut comm = std::ptr::null_mut();
    // SAFETY: `comm` receives the handle and `config` outlives the call (NCCL copies it).
    let started = unsafe { result::comm_init_rank_config(&mut comm, world as i32, id, rank as i32, &mut config) };
    if let Err(e) = started {
        let comm = (!comm.is_null()).then_some(comm);
        return Err((Unsettled::Failed("ncclCommInitRankConfig", e.0), comm));
    }
    match settle(comm, "init", rank, world, deadline) {
        Ok(()) => Ok(comm),
        Err(why) => Err((why, Some(comm))),
    }
}

/// Polls the communicator's asynchronous state until the call it last returned
/// ncclInProgress for has finished, failed, or run past `deadline`.
pub(crate) fn settle(
    comm: sys::ncclComm_t,
    op: &'static str,
    rank: usize,
    world: usize,
    deadline: Deadline,
) -> Result<(), Unsettled> {
    poll_with_deadline(
        deadline,
        || match async_state(comm) {
            sys::ncclResult_t::ncclSuccess => Ok(true),
            sys::ncclResult_t::ncclInProgress => Ok(false),
            code => Err(Unsettled::Reported(code)),
        },
        |limit| Unsettled::TimedOut(timed_out_waiting(op, limit, rank, world)),
    )
}

/// ncclCommGetAsyncError: ncclInProgress while a non-blocking call goes on, ncclSuccess once
/// it finished, else the error a peer or the network caused.
pub(crate) fn async_state(comm: sys::ncclComm_t) -> sys::ncclResult_t {
    let mut state = sys::ncclResult_t::ncclSuccess;
    // SAFETY: `comm` is a live communicator (callers hold it through `CommHandle::with` or
    // have just made it); NCCL writes one result code.
    let asked = unsafe { sys::ncclCommGetAsyncError(comm, &mut state) };
    if asked != sys::ncclResult_t::ncclSuccess {
        return asked;
    }
    state
}
