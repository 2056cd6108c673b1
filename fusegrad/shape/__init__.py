"""Shapes: Views (one affine index map with a valid mask) and ShapeTrackers (stacks of them) for movement ops.

Movement ops never copy data; they change how kernels index buffers. See DESIGN.md section 4.
"""
from fusegrad.shape.view import View, sint
from fusegrad.shape.shapetracker import ShapeTracker

__all__ = ["View", "ShapeTracker", "sint"]
