//! The model runs on its own OS thread; handlers talk to it through a bounded channel and
//! get the answer back on a oneshot (text-embeddings-inference's `backends/src/lib.rs`
//! pattern). Handlers never hold a session, and a slow decode never blocks the async
//! runtime.

use std::panic::AssertUnwindSafe;
use std::thread::JoinHandle;

use tokio::sync::{mpsc, oneshot};

use crate::backend::{Backend, BackendError};
use crate::decode::{greedy_decode, DecodeInput, DecodeOutput, SpecialIds};

#[derive(Debug, thiserror::Error)]
pub enum TranslateError {
    #[error("the model queue is full; retry later")]
    Overloaded,
    #[error("the model worker is not running")]
    Stopped,
    #[error("translation failed: {0}")]
    Backend(#[from] BackendError),
}

enum Command {
    Decode {
        inputs: Vec<DecodeInput>,
        reply: oneshot::Sender<Result<Vec<DecodeOutput>, BackendError>>,
    },
}

/// Cheap to clone handle to the model worker. The worker thread ends when the last handle
/// is dropped.
#[derive(Clone, Debug)]
pub struct Translator {
    sender: mpsc::Sender<Command>,
}

impl Translator {
    /// Moves `backend` onto a new thread named `model-worker`. At most `queue_capacity`
    /// batches wait for it; more are refused with [`TranslateError::Overloaded`].
    pub fn spawn<B>(
        backend: B,
        special: SpecialIds,
        queue_capacity: usize,
    ) -> std::io::Result<(Self, JoinHandle<()>)>
    where
        B: Backend + Send + 'static,
    {
        let (sender, receiver) = mpsc::channel(queue_capacity.max(1));
        let handle = std::thread::Builder::new()
            .name("model-worker".into())
            .spawn(move || worker_loop(backend, special, receiver))?;
        Ok((Translator { sender }, handle))
    }

    /// Decodes `inputs` as one batch; outputs come back in input order.
    pub async fn translate(
        &self,
        inputs: Vec<DecodeInput>,
    ) -> Result<Vec<DecodeOutput>, TranslateError> {
        let (reply, answer) = oneshot::channel();
        self.sender
            .try_send(Command::Decode { inputs, reply })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => TranslateError::Overloaded,
                mpsc::error::TrySendError::Closed(_) => TranslateError::Stopped,
            })?;
        // A dropped reply means the worker died mid-request.
        Ok(answer.await.map_err(|_| TranslateError::Stopped)??)
    }
}

fn worker_loop<B: Backend>(
    mut backend: B,
    special: SpecialIds,
    mut receiver: mpsc::Receiver<Command>,
) {
    while let Some(command) = receiver.blocking_recv() {
        match command {
            Command::Decode { inputs, reply } => {
                if reply.is_closed() {
                    // The client went away while queued: skip the work.
                    continue;
                }
                let started = std::time::Instant::now();
                // A bug in the loop must fail one request, not take the worker down.
                let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    greedy_decode(&mut backend, special, &inputs)
                }))
                .unwrap_or_else(|panic| {
                    let message = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "unknown panic".into());
                    Err(BackendError::Inference(format!(
                        "decode loop panicked: {message}"
                    )))
                });
                tracing::debug!(
                    batch = inputs.len(),
                    elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
                    ok = result.is_ok(),
                    "decoded batch"
                );
                let _ = reply.send(result);
            }
        }
    }
    tracing::debug!("model worker stopped");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::testing::{CopyBackend, SPECIAL};

    #[tokio::test]
    async fn decodes_on_the_worker_and_stops_when_handles_drop() {
        let (translator, handle) = Translator::spawn(CopyBackend::default(), SPECIAL, 4).unwrap();
        let out = translator
            .translate(vec![DecodeInput {
                source_ids: vec![4, 5, 2],
                max_output_tokens: 10,
            }])
            .await
            .unwrap();
        assert_eq!(out[0].ids, vec![4, 5]);
        drop(translator);
        tokio::task::spawn_blocking(move || handle.join().unwrap())
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn backend_failures_become_translate_errors() {
        let backend = CopyBackend {
            fail: true,
            ..Default::default()
        };
        let (translator, _handle) = Translator::spawn(backend, SPECIAL, 4).unwrap();
        let err = translator
            .translate(vec![DecodeInput {
                source_ids: vec![4, 2],
                max_output_tokens: 10,
            }])
            .await
            .unwrap_err();
        assert!(matches!(err, TranslateError::Backend(_)), "{err}");
    }
}
