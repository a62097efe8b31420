// Package admin is the worker's admin server: an HTTP API and a small
// server-rendered page for the DLQ operations of package dlq (list, show,
// replay, discard, and the audit trail). It runs inside the worker process
// on its own port (ADMIN_ADDR) and only when ADMIN_TOKEN is set.
//
// Authentication:
//
//   - The API (/api/…) takes only "Authorization: Bearer <ADMIN_TOKEN>",
//     never a cookie, so a browser cannot be tricked into calling it. The
//     operator recorded in the audit trail is the X-Operator header, or
//     ADMIN_OPERATOR.
//   - The page (/ui/…) signs in with the same token and the operator's name
//     and then uses a session cookie: HttpOnly, SameSite=Strict, Secure
//     behind TLS, HMAC-signed with a key derived from the token (rotating the
//     token ends every session), expiring after ADMIN_SESSION_TTL. Every form
//     carries a CSRF token bound to the session, and Go's cross-origin
//     protection refuses cross-site POSTs on top of that. The page uses no
//     JavaScript; its Content-Security-Policy allows none.
//   - Tokens are compared in constant time (over their SHA-256, so the
//     length does not leak either). Unauthenticated requests get 401: JSON
//     on the API, the sign-in form on the page.
//
// Replay and discard on the page have a confirmation step: the buttons lead
// to a page that shows the message and what will happen, and only its POST
// acts. Failure handling is package dlq's: the server adds none of its own.
// A request that fails part-way answers 503 with what was already done. A
// broken request can leave nothing half-done in the DLQ, since every
// operation's connection is closed at the end of the request and the broker
// requeues whatever it held.
package admin
