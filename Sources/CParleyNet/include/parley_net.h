#ifndef PARLEY_NET_H
#define PARLEY_NET_H

/// Opens a new TUN device (IP packets, no packet-information header) named `name`, non-blocking.
/// Answers its file descriptor, or -1 with errno set.
int parley_tun_open(const char *name);

/// Moves the calling thread into the network namespace open at `fd` (setns(2) with
/// CLONE_NEWNET). Answers 0, or -1 with errno set.
int parley_enter_network_namespace(int fd);

#endif
