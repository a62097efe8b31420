// Package webhooksecrets reads webhook signing secrets from files, as
// Kubernetes mounts a Secret, and keeps the verifiers built from them
// current, so that the documented rotation (add the new secret, switch the
// provider to it, remove the old one) is three edits of a Secret and no
// restart.
//
// The kubelet updates a mounted Secret by writing a new directory and
// swapping the ..data symlink, so a file is replaced whole, never seen half
// written; it does so a minute or so after the Secret changed. A Watcher
// therefore re-reads every file on an interval (a stat would miss a swap
// that keeps the size and the second of the modification time) and applies
// the content when it differs from the last one applied. The new verifier
// replaces the old one atomically (Verifier): a request is checked against
// either the old set or the new one, never a mix or none.
//
// A file that cannot be read, holds no secret, or holds one the verifier
// refuses leaves the secrets in force as they are, with a log line and a
// count (idempotent_events_receiver_webhook_secrets_reloads_total{result=
// "refused"}): a mistake during a rotation must not turn every delivery
// into a 401. Neither the log line nor any error quotes a file's content.
package webhooksecrets
