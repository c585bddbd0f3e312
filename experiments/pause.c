/* A pod sandbox's process for experiments/pod_cold_node.py: holds the namespaces, exits on
   SIGTERM or SIGINT, as kubelet's pause container does. */
#include <signal.h>
#include <unistd.h>
static void bye(int s) { (void)s; _exit(0); }
int main(void) {
    signal(SIGINT, bye);
    signal(SIGTERM, bye);
    for (;;) pause();
}
