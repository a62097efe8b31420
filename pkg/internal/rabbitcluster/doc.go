// Package rabbitcluster starts a private RabbitMQ cluster on loopback ports
// with the machine's own rabbitmq-server, for tests and the chaos suite to
// kill its nodes: the node leading a quorum queue SIGKILLed, restarted,
// then another.
//
// Every node is a separate rabbitmq-server (one Erlang VM) with its own
// node name (ie-<random>-<i>@localhost), AMQP and distribution ports on
// 127.0.0.1, data, logs, configuration, enabled plugins (none: no
// management listener) and rabbitmq-env.conf in a temporary directory, so
// nothing of the machine's own node (rabbit@localhost on 5672, its
// /etc/rabbitmq files and /var/lib/rabbitmq data) is read or touched. The
// nodes share only the machine's epmd and Erlang cookie: when the tests run
// as root the nodes and the CLI run as the machine's rabbitmq user, with
// its home, which is where the machine's rabbitmqctl (a wrapper that
// switches to that user) finds the cookie; otherwise as the current user
// with $HOME/.erlang.cookie.
//
// Node 1 boots first with the tests' user and vhost in its configuration;
// the others join it with rabbitmqctl stop_app, join_cluster, start_app.
// Kill SIGKILLs the node's Erlang VM (its OS pid read with os:getpid() at
// every start) and nothing else; Restart boots it again on its data, and it
// rejoins the cluster. Close kills every node and removes the directory.
// Each node's process runs with a parent-death signal, so a test binary
// that dies without Close takes the nodes with it.
//
// It is for tests only: no product package imports it
// (pkg/internal/app/layers_test.go checks).
package rabbitcluster
