//! A consumer's `batch` command: one outbox row or Kafka record holding many commands
//! ([`crate::batch`] has the shape), each decoded as a row or record of its own method would be
//! (Centrifugo's fields included) and published under its own idempotency key
//! ([`crate::batch::command_key`] of the row's or record's key, unless it carries one).
//!
//! In order (the default), the commands run one after another and a command the broker could
//! not take now stops the batch there: the consumer runs the whole batch again later, the
//! commands before it answering their earlier positions (their keys), so order holds. With
//! `parallel` they all run at once. Commands refused for good (malformed, unknown channel) do
//! not stop the others: the row or record is dead-lettered with their errors once the rest ran.

use herald_core::NodeContext;

use crate::batch::{command_key, Batch, BatchCommand};
use crate::centrifugo::command::{action, decode};
use crate::publishing::{self, Command, PublishError};

/// At most this many commands' errors are written into a dead letter.
const MAX_LISTED: usize = 5;

/// What running a batch came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every command done (or found done before under its key).
    Done,
    /// Some commands can never run as they are (the others ran): their errors.
    Refused(String),
    /// A command the broker could not take now: run the batch again with the same key.
    Retry(String),
}

/// Run `batch`, the row's or record's command, whose own idempotency key is `key`.
pub async fn run(ctx: &NodeContext, batch: &Batch, key: &str) -> Outcome {
    let calls = batch
        .commands
        .iter()
        .enumerate()
        .map(|(i, command)| async move {
            let command = command.as_ref().map_err(Clone::clone)?;
            one(ctx, command, &command_key(key, i)).await
        });
    let results: Vec<Result<(), PublishError>> = if batch.parallel {
        futures_util::future::join_all(calls).await
    } else {
        let mut results = Vec::with_capacity(batch.commands.len());
        for call in calls {
            let result = call.await;
            let stop = result.as_ref().is_err_and(PublishError::is_retryable);
            results.push(result);
            if stop {
                break;
            }
        }
        results
    };
    let describe = |(i, e): (usize, &PublishError)| {
        let method = batch.commands[i]
            .as_ref()
            .map(|c| c.method.as_str())
            .unwrap_or("?");
        format!("command {i} ({method}): {e}")
    };
    let errors = || {
        results
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.as_ref().err().map(|e| (i, e)))
    };
    if let Some(retry) = errors().find(|(_, e)| e.is_retryable()) {
        return Outcome::Retry(describe(retry));
    }
    let failed = errors().count();
    if failed == 0 {
        return Outcome::Done;
    }
    let mut listed: Vec<String> = errors().take(MAX_LISTED).map(describe).collect();
    if failed > MAX_LISTED {
        listed.push(format!("… and {} more", failed - MAX_LISTED));
    }
    Outcome::Refused(format!(
        "{failed} of {} commands of the batch failed: {}",
        batch.commands.len(),
        listed.join("; ")
    ))
}

/// One command, as a row or record of its method. A broadcast whose channels failed is an
/// error: retryable when any channel's failure is.
async fn one(ctx: &NodeContext, command: &BatchCommand, key: &str) -> Result<(), PublishError> {
    let (method, payload) = (command.method.as_str(), command.body());
    publishing::check_body_size(&ctx.config.limits, method, payload.len())?;
    if let Some(action) = action(method, payload, &ctx.namespaces)? {
        return action.run(ctx).await;
    }
    let cmd = decode(method, payload)?;
    let mut done = publishing::execute(ctx, &cmd, Some(key)).await?;
    if let Command::Publish { .. } = cmd {
        return done
            .results
            .pop()
            .expect("one result per channel")
            .map(drop);
    }
    let failed: Vec<String> = done
        .failed(&cmd)
        .take(MAX_LISTED)
        .map(|(channel, e)| format!("{channel}: {e}"))
        .collect();
    if failed.is_empty() {
        return Ok(());
    }
    let message = format!(
        "{} of {} channels failed: {}",
        done.failed(&cmd).count(),
        cmd.channels().len(),
        failed.join("; ")
    );
    if done.retryable() {
        return Err(PublishError::Unavailable(message));
    }
    let code = done.failed(&cmd).next().map(|(_, e)| e.error_code());
    Err(PublishError::refused(
        code.unwrap_or(herald_protocol::ErrorCode::BadRequest),
        message,
    ))
}
