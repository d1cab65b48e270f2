/*
 * sim.h -- `kvpool sim`: the engine simulator (instances x TP ranks driving
 * the connector against a real pool), a tool beside the product.
 */
#ifndef KVP_SIM_H
#define KVP_SIM_H

/* argv[0] is "sim"; returns the process exit status. */
int kvp_sim_main(int argc, char **argv);
#endif
