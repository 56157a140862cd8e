//! The gRPC service: validate, then hand the report to the state.

use std::sync::{Arc, Mutex};

use limiter_proto::{
    pb::{allocator_server::Allocator, ReportReply, ReportRequest},
    validate,
};
use tonic::{Request, Response, Status};

use crate::{now_ns, state::State};

pub struct Service {
    pub state: Arc<Mutex<State>>,
}

#[tonic::async_trait]
impl Allocator for Service {
    async fn report(
        &self,
        request: Request<ReportRequest>,
    ) -> Result<Response<ReportReply>, Status> {
        let report = request.into_inner();
        let mut state = self
            .state
            .lock()
            .map_err(|_| Status::internal("allocator state poisoned"))?;
        if let Err(e) = validate(&report) {
            state.rejected += 1;
            tracing::warn!(host = %report.host.chars().take(64).collect::<String>(), "report refused: {e}");
            return Err(Status::invalid_argument(e.to_string()));
        }
        Ok(Response::new(state.handle(&report, now_ns())))
    }
}
