/*
 * tcpecho: a two-process tree holding a listening TCP socket and an established connection,
 * both ends inside the tree, to check that CRIU (--tcp-established) restores them.
 *
 * The parent listens on 127.0.0.1 (port 0 = any) and echoes every line as "echo PID LINE".
 * The child connects once at start and keeps that connection. On SIGUSR1 the child reads
 * CTLDIR/req ("NONCE ping"), sends a line over its old connection, waits for the echo and writes
 * CTLDIR/resp "NONCE ok <echo line>" (or "NONCE FAIL ..."). The child writes CTLDIR/resp
 * "ready ok CHILD_PID PARENT_PID PORT" once connected.  usage: tcpecho CTLDIR
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const char *ctl;

static void respond(const char *nonce, const char *fmt, ...)
{
	char tmp[4096], dst[4096];
	snprintf(tmp, sizeof(tmp), "%s/resp.tmp", ctl);
	snprintf(dst, sizeof(dst), "%s/resp", ctl);
	FILE *f = fopen(tmp, "w");
	if (!f)
		return;
	fprintf(f, "%s ", nonce);
	va_list ap;
	va_start(ap, fmt);
	vfprintf(f, fmt, ap);
	va_end(ap);
	fputc('\n', f);
	fclose(f);
	rename(tmp, dst);
}

static void serve(int lsk)
{
	struct pollfd pf[64];
	char buf[64][512];
	size_t used[64];
	int n = 1;
	pf[0].fd = lsk;
	pf[0].events = POLLIN;
	for (;;) {
		if (poll(pf, n, -1) < 0) {
			if (errno == EINTR)
				continue;
			exit(1);
		}
		if ((pf[0].revents & POLLIN) && n < 64) {
			int c = accept(lsk, NULL, NULL);
			if (c >= 0) {
				pf[n].fd = c;
				pf[n].events = POLLIN;
				pf[n].revents = 0;
				used[n] = 0;
				n++;
			}
		}
		for (int i = 1; i < n; i++) {
			if (!(pf[i].revents & (POLLIN | POLLHUP | POLLERR)))
				continue;
			ssize_t r = read(pf[i].fd, buf[i] + used[i], sizeof(buf[i]) - 1 - used[i]);
			if (r <= 0) {
				close(pf[i].fd);
				pf[i] = pf[n - 1];
				memcpy(buf[i], buf[n - 1], used[n - 1]);
				used[i] = used[n - 1];
				n--;
				i--;
				continue;
			}
			used[i] += r;
			char *nl;
			while ((nl = memchr(buf[i], '\n', used[i]))) {
				char out[600];
				*nl = 0;
				int len = snprintf(out, sizeof(out), "echo %d %s\n", getpid(), buf[i]);
				if (write(pf[i].fd, out, len) < 0)
					break;
				size_t rest = used[i] - (nl + 1 - buf[i]);
				memmove(buf[i], nl + 1, rest);
				used[i] = rest;
			}
		}
	}
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s CTLDIR\n", argv[0]);
		return 2;
	}
	ctl = argv[1];
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGUSR1);
	sigprocmask(SIG_BLOCK, &set, NULL);

	int lsk = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t alen = sizeof(a);
	setsockopt(lsk, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(lsk, (struct sockaddr *)&a, sizeof(a)) || listen(lsk, 16) ||
	    getsockname(lsk, (struct sockaddr *)&a, &alen)) {
		perror("listen");
		return 1;
	}
	pid_t parent = getpid();
	pid_t child = fork();
	if (child < 0)
		return 1;
	if (child > 0)
		serve(lsk);

	close(lsk);
	int c = socket(AF_INET, SOCK_STREAM, 0);
	if (connect(c, (struct sockaddr *)&a, sizeof(a))) {
		perror("connect");
		return 1;
	}
	FILE *in = fdopen(dup(c), "r");
	respond("ready", "ok %d %d %d", getpid(), parent, ntohs(a.sin_port));
	unsigned long seq = 0;
	for (;;) {
		if (sigwaitinfo(&set, NULL) != SIGUSR1)
			continue;
		char path[4096], line[256], nonce[64] = "?", reply[600];
		snprintf(path, sizeof(path), "%s/req", ctl);
		FILE *f = fopen(path, "r");
		if (!f)
			continue;
		if (!fgets(line, sizeof(line), f))
			line[0] = 0;
		fclose(f);
		sscanf(line, "%63s", nonce);
		char msg[128];
		int len = snprintf(msg, sizeof(msg), "hello %lu\n", ++seq);
		if (write(c, msg, len) != len) {
			respond(nonce, "FAIL write: %s", strerror(errno));
			continue;
		}
		if (!fgets(reply, sizeof(reply), in)) {
			respond(nonce, "FAIL read: %s", feof(in) ? "connection closed" : strerror(errno));
			continue;
		}
		reply[strcspn(reply, "\n")] = 0;
		respond(nonce, "ok %s", reply);
	}
}
