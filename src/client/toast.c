/* toast.c - the client (issue 4). */
#include <stdio.h>
int main(void) { fprintf(stderr, "toast: not built yet\n"); return 2; }
