/* kiln.c - the `kiln` command-line client's main(): everything else is in cli/ (cli_main). */
#include "cli/cli.h"

int main(int argc, char **argv)
{
    return cli_main(argc, argv);
}
