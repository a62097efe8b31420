// Package webhook is the vocabulary of webhook verification: the Verifier
// contract, the reasons a signature is refused (Error, Reason) and what a
// delivery's headers say about it (Delivery). It also holds the three HMAC
// schemes that predate the provider packages: Stripe (Stripe-Signature),
// Standard Webhooks (webhook-id, webhook-timestamp, webhook-signature) and
// GitHub (X-Hub-Signature-256). Each verifier takes several secrets, so a
// secret can be rotated without downtime, and reports which one matched.
//
// A provider (pkg/internal/provider and its subpackages) is built on these;
// a provider whose scheme is its own alone (PayPal's certificates) keeps
// its verifier in its own package.
package webhook
