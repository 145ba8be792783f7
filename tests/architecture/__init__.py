"""Checks of the project's structure: layers, import graph, module and function sizes."""
