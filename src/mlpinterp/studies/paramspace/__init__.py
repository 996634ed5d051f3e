"""Shared by the parameter-space studies (APD, SPD): figures and run directories."""
