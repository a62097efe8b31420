// Package webhook verifies provider webhook signatures on the raw request
// body, before anything parses it. Three schemes are supported: Stripe
// (Stripe-Signature), Standard Webhooks (webhook-id, webhook-timestamp,
// webhook-signature) and GitHub (X-Hub-Signature-256). Each verifier takes
// several secrets, so a secret can be rotated without downtime, and reports
// which one matched.
package webhook
