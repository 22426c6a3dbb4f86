"""Kernel layer: tensor expressions, the loop-nest IR, schedules and lowering."""
